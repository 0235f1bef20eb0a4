"""The root config's schema: the structured config every command composes from, and CONF_DIR.

`conf/config.yaml` lists every group (model, task, policy, logger, experiment) and starts from the
`kvbench_schema` node registered here (`RootConfig`), so an unknown key or a value of the wrong type fails
at composition, before any check of kvbench's own (kvbench.config.validate). Group nodes are `_target_`
configs left open (`Any`): a policy or task node instantiates straight into its dataclass
(kvbench.config.groups), whose own validation names a bad override.

Pure data: importing this module registers the schema with Hydra's ConfigStore and does nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"  # the Hydra configs: the package kvbench.conf (in every install)


@dataclass
class GenConfig:
    max_new_tokens: int | None = None  # null: the task's own length (RULER's per task), else 32 (config.presets)
    ignore_eos: bool = False
    prefill_chunk: int | None = None  # default: whole prompt (no prefill eviction) or evict_every
    score_chunk: int = 64  # queries per chunk when computing attention weights for scores
    attention: str = "auto"  # auto | sdpa | flash | eager (the paper's: transformers' eager path) | fused (kvbench.attention)
    warmup: bool | None = None  # run one untimed batch first; null: on CUDA only (its lazy setup is not timed)
    kv_cache_dtype: str = "auto"  # auto (the model's dtype) | int8 | int4: K/V stored quantized (KIVI, kvbench.quant)
    # G: numbers per scale and zero point (keys: G tokens of a channel; values: G channels); null: serve.block_size
    kv_quant_group: int | None = None  # for a quantized pool in mode=serve (a page is its key group), else 32 (presets)
    kv_quant_residual: int = 32  # R: the newest pairs always held in full precision (the window holds R to R + G - 1)


@dataclass
class DataConfig:
    dir: str | None = None  # local mirror of the datasets; null: the Hugging Face Hub


@dataclass
class MemoryConfig:
    limit_gb: float | None = None  # GiB per device. CUDA: a real cap; CPU: an accounted limit (kvbench.memory)
    reserve_gb: float = 0.0  # GiB per device the account cannot see (CUDA context, allocator slack): taken off the budget


@dataclass
class SearchConfig:
    max_batch: bool = False
    candidates: Any = "divisors_of_960"  # divisors_of_960 | all | [explicit, list]
    max: int | None = None
    only: bool = False  # stop after the search, record its result
    decode_steps: int = 4  # decode steps of a probe
    probe: str = "real"  # real: run each trial; account: CPU only, decide from the accounted peak alone


@dataclass
class OutputConfig:
    save_prompt_ids: bool = False


@dataclass
class ReproduceConfig:
    """The paper's protocol (docs/method.md, the experimental protocol), read by kvbench-reproduce; no single run
    uses it."""

    ed_kv_size: int = 2  # ED's |kv|: the decoding-only throughput bound and its first OOM batch b0
    kv_sizes: list[int] = field(default_factory=lambda: list(range(128, 3584 + 1, 128)))  # BM's coarse grid
    kv_step: int = 128  # if no grid point reaches near_fkv x FKV: go on up in multiples of kv_step
    refine_step: int = 64  # then the kv sizes +-refine_step around the best coarse one
    near_fkv: float = 0.96  # pick (b): best throughput at accuracy >= near_fkv * FKV's ("near FKV")


@dataclass
class PlanConfig:
    """kvbench-plan: the node and prompts a capacity plan is made for; no run reads it."""

    gpus: int | None = None  # GPUs of the node; null: as many as model.max_memory names, else the CPU
    gpu_mem_mib: int | None = None  # memory per GPU (MiB): placement and budget; null: memory.limit_gb / max_memory
    prompt_tokens: int | None = None  # every prompt this long (the worst case); null: the task's real prompts
    backends: list[str] = field(default_factory=lambda: ["eager", "sdpa"])  # gen.attention values to plan
    kv_sizes: list[int] | None = None  # the evicting policy's kv sizes; null: [policy.kv_size]


@dataclass
class ServeConfig:
    """mode=serve and mode=serve_limits (kvbench.serve): continuous batching over a paged KV pool."""

    num_blocks: int | None = 256  # blocks in the pool; null: as many as memory.limit_gb leaves after the weights
    block_size: int = 16  # tokens per block (policy.kv_size must be a multiple)
    max_tokens_per_step: int = 256  # tokens one forward may process (prefill chunks + decode rows)
    max_running: int | None = None  # most requests running at once; null: as many as the pool admits
    rate: float | None = None  # Poisson arrivals, requests/s (seeded by `seed`); null: all at time 0
    block_score: str = "sum"  # sum | norm_sum (OpenVINO's NORM_SUM: each pair's score / its lifetime)
    eviction: str = "policy"  # policy: as configured | openvino: OpenVINO GenAI's preset (kvbench.config.presets), policy=h2o
    slo_ttft_s: float = 5.0  # goodput's objectives: time to first token and time per output token (seconds)
    slo_tpot_s: float = 0.5
    limit_cap: int = 16384  # mode=serve_limits: the longest generation tried (eviction makes it unbounded)
    plot: bool = True  # write the pool utilisation / running requests plot next to the predictions


@dataclass
class RootConfig:
    model: Any = MISSING
    task: Any = MISSING
    policy: Any = MISSING
    logger: Any = MISSING
    experiment_name: str | None = None
    mode: str = "run"  # one of MODES: run | prompt_report | serve | serve_limits
    batch_size: int = 1
    gen: GenConfig = field(default_factory=GenConfig)
    data: DataConfig = field(default_factory=DataConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    reproduce: ReproduceConfig = field(default_factory=ReproduceConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    results_dir: str = "results"
    skip_existing: bool | None = None  # null: true in a sweep (-m) and the driver, false for one run
    seed: int = 0
    device: str = "auto"


MODES = ("run", "prompt_report", "serve", "serve_limits")
SERVE_MODES = ("serve", "serve_limits")  # the modes that read serve.*
SERVE_ATTENTION = ("auto", "sdpa")  # gen.attention values mode=serve applies (its paged SDPA)


def register_schema() -> None:
    """Store `RootConfig` as `kvbench_schema`, the node conf/config.yaml starts from (idempotent)."""
    ConfigStore.instance().store(name="kvbench_schema", node=RootConfig)


register_schema()
