"""Admission: a run's memory limit (`memory.limit_gb`, GiB per device) and the batches it lets through.

On CPU the limit is *accounted*: before a batch runs, its accounted peak (`kvbench.memory.accounting`) is
compared with the limit less `memory.reserve_gb`, and a batch over it raises `MemoryLimitExceeded` (an
`OutOfMemory` of kind "accounted": the run is an "oom") before anything is allocated. On CUDA the limit is
the allocator's own cap (`kvbench.memory.cap`), so admission lets every CUDA device through. A model whose
weights alone are over the limit is bad input (`ModelDoesNotFit`, a ConfigError), not a measurement.

A memory limit is never called a budget: "budget" means KV pairs (policies' budgets, kvbench.budgets).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.errors import ConfigError, OutOfMemory
from kvbench.memory.accounting import Account, GiB
from kvbench.memory.shape import ModelShape


class MemoryLimitExceeded(OutOfMemory):
    """A batch's accounted peak is over the CPU memory limit (raised before anything is allocated)."""

    def __init__(self, message: str, account: Account):
        super().__init__(message, kind="accounted")
        self.account = account


class ModelDoesNotFit(ConfigError):
    """memory.limit_gb is below the model's own weights: bad input, not a measurement."""


@dataclass(frozen=True)
class MemoryLimit:
    """memory.limit_gb of a run, in bytes per device, less memory.reserve_gb (what the account cannot see)."""

    gb: float
    reserve_gb: float = 0.0

    @property
    def bytes(self) -> int:
        return int(self.gb * GiB)

    @property
    def usable(self) -> int:
        """Bytes per device the accounted peak may reach: the limit less the reserve."""
        return int((self.gb - self.reserve_gb) * GiB)

    def admit(self, acc: Account) -> None:
        """Raise MemoryLimitExceeded if a CPU device's accounted peak is over the limit (CUDA is capped for real)."""
        for dev, f in acc.devices.items():
            if dev == "cpu" and f.total > self.usable:
                reserve = f" less memory.reserve_gb={self.reserve_gb:g}" if self.reserve_gb else ""
                raise MemoryLimitExceeded(
                    f"accounted peak {acc.describe(dev)} exceeds memory.limit_gb={self.gb:g}{reserve} on {dev}", acc
                )

    def check_weights(self, model) -> None:
        """Raise ModelDoesNotFit when the weights alone are over the limit on some device."""
        for dev, w in ModelShape.of(model).weights.items():
            if w > self.usable:
                raise ModelDoesNotFit(
                    "memory.limit_gb",
                    f"the model alone does not fit: its weights take {w / GiB:.3f} GiB on {dev}",
                    self.gb,
                )


def memory_limit_of(cfg) -> MemoryLimit | None:
    """The run's memory limit from `memory.limit_gb` and `memory.reserve_gb`, None when there is none."""
    if cfg.memory.limit_gb is None:
        return None
    return MemoryLimit(float(cfg.memory.limit_gb), float(cfg.memory.get("reserve_gb") or 0.0))
