"""Extreme decoding-only eviction (ED, Algorithm 2 of docs/method.md).

Prefill with the full cache, then keep only the most recent pair; each decode step processes one
token and, when the cache holds `kv_size` pairs, again keeps only the most recent one. With
kv_size=2 it always attends to the smallest non-empty cache: an upper bound on the throughput of
any decoding-only policy (its accuracy is useless by design).

In kvbench's evict-before-forward form: evict_every = kv_size - 1, so an eviction leaves 1 pair.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.errors import ConfigError
from kvbench.policies.policy import Policy, ScoreContext


@dataclass
class ExtremeDecode(Policy):
    kv_size: int | None = 2
    evict_every: int | None = None  # always kv_size - 1
    schedule: str = "decode_only"
    name: ClassVar[str] = "extreme_decode"
    label: ClassVar[str] = "ED"
    summary: ClassVar[str] = "one pair, evicting at every decode step (ED: the decoding-only throughput bound)"
    paper: ClassVar[tuple[str, str]] = ("Metel et al., 2025, Algorithm 2", "https://arxiv.org/abs/2412.05693")
    # Algorithm 2 fixes them: one pair kept (no share of the prompt), p = kv_size - 1, decoding only
    inert_keys: ClassVar[tuple[str, ...]] = ("kv_ratio", "compression_ratio", "evict_every", "schedule")
    keeps_newest: ClassVar[bool] = True  # the score below, known without computing it

    def validate(self) -> None:
        for key in ("kv_ratio", "compression_ratio"):
            if getattr(self, key) is not None:
                raise ConfigError(f"policy.{key}", "extreme_decode keeps one pair whatever the prompt (Algorithm 2): "
                                  "its budget is kv_size, not a share of the prompt", getattr(self, key))
        if self.kv_size is None or not isinstance(self.kv_size, int) or self.kv_size < 2:
            raise ConfigError("policy.kv_size", "extreme_decode needs an integer kv_size >= 2", self.kv_size)
        if self.evict_every is None:
            self.evict_every = self.kv_size - 1
        if self.evict_every != self.kv_size - 1:
            raise ConfigError(
                "policy.evict_every",
                f"extreme_decode always keeps one pair: evict_every is kv_size - 1 = {self.kv_size - 1}",
                self.evict_every,
            )
        if self.schedule != "decode_only":
            raise ConfigError("policy.schedule", "extreme_decode is decoding-only (Algorithm 2)", self.schedule)
        super().validate()

    def score(self, stats: ScoreContext) -> torch.Tensor:
        return stats.pos.float()
