"""The node a capacity plan is made for: each device's memory limit, and the memory device_map places by.

Described by `plan.gpus` x `plan.gpu_mem_mib`, else the GPUs of `model.max_memory` (each capped at
`memory.limit_gb` when set), else the CPU under the accounted `memory.limit_gb`. On every device
`memory.reserve_gb` is taken off (the CUDA context and allocator slack the account does not see).
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from kvbench import memory
from kvbench.errors import ConfigError

MiB = 2**20


@dataclass(frozen=True)
class Node:
    """Where the plan runs: each device's usable bytes (memory limit less reserve), and the placement memory."""

    usable: dict[str, int]  # "cuda:0" / "cpu" -> bytes an accounted peak may reach
    memory_limit: dict[str, int]  # the same before memory.reserve_gb
    max_memory: dict[int, int] | None  # per-GPU memory for device_map=auto; None on the CPU

    @property
    def gpu(self) -> bool:
        return self.max_memory is not None

    def describe(self) -> str:
        sizes = sorted(set(self.memory_limit.values()))
        each = "/".join(f"{b / MiB:.0f}" for b in sizes)
        return f"{len(self.memory_limit)} x GPU {each} MiB" if self.gpu else f"CPU, accounted memory limit {each} MiB"


def _mem_bytes(v) -> int:
    from accelerate.utils import convert_file_size_to_int

    return int(v) if isinstance(v, (int, float)) else convert_file_size_to_int(str(v))


def node_of(cfg: DictConfig) -> Node:
    """The node described by plan.gpus / plan.gpu_mem_mib, model.max_memory, memory.limit_gb."""
    p, limit_gb = cfg.plan, cfg.memory.limit_gb
    reserve = int(float(cfg.memory.reserve_gb or 0) * memory.GiB)
    given = {int(k): _mem_bytes(v) for k, v in (cfg.model.get("max_memory") or {}).items() if str(k).isdigit()}
    gpus = p.gpus if p.gpus is not None else len(given)
    if not gpus:
        if limit_gb is None:
            raise ConfigError("memory.limit_gb", "a CPU plan needs an accounted memory limit (GiB); or describe GPUs with"
                              " plan.gpus and plan.gpu_mem_mib")
        b = int(limit_gb * memory.GiB)
        return Node(usable={"cpu": b - reserve}, memory_limit={"cpu": b}, max_memory=None)
    if p.gpu_mem_mib is not None:
        place = dict.fromkeys(range(gpus), p.gpu_mem_mib * MiB)
    elif given and all(i in given for i in range(gpus)):
        place = {i: given[i] for i in range(gpus)}
    elif limit_gb is not None:
        place = dict.fromkeys(range(gpus), int(limit_gb * memory.GiB))
    else:
        raise ConfigError("plan.gpu_mem_mib", f"{gpus} GPUs need their memory: plan.gpu_mem_mib, model.max_memory"
                          " or memory.limit_gb", None)
    cap = None if limit_gb is None or p.gpu_mem_mib is not None else int(limit_gb * memory.GiB)
    limit = {f"cuda:{i}": (m if cap is None else min(m, cap)) for i, m in place.items()}
    if any(b <= reserve for b in limit.values()):
        raise ConfigError("memory.reserve_gb", "leaves no memory on a GPU of the plan", cfg.memory.reserve_gb)
    return Node(usable={d: b - reserve for d, b in limit.items()}, memory_limit=limit, max_memory=place)


def check(cfg: DictConfig) -> None:
    """The node a plan describes (no model, no tokenizer): ConfigError naming the key. The plan.* keys'
    own values are checked by kvbench.config.prepare, for every command alike."""
    node_of(cfg)
