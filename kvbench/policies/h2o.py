"""H2O (heavy hitters): score = attention summed over every query so far; the most recent half of
the budget is protected (protect_recent defaults to kv_size // 2). Originally decoding-only, one
pair per step (p = 1); runs under prefill_and_decode too.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.policies.base import Policy, ScoreStats


@dataclass
class H2O(Policy):
    kv_size: int | None = 256
    evict_every: int = 1
    schedule: str = "decode_only"
    protect_recent: int | None = None  # None: kv_size // 2
    name: ClassVar[str] = "h2o"
    needs_attention: ClassVar[bool] = True

    def validate(self) -> None:
        if self.protect_recent is None and isinstance(self.kv_size, int):
            self.protect_recent = self.kv_size // 2
        super().validate()

    def score(self, stats: ScoreStats) -> torch.Tensor:
        return stats.sum_w

    def describe(self) -> dict:
        d = super().describe()
        half = self.kv_size // 2
        d["extensions"] = [e for e in d["extensions"] if e != f"protect_recent={half}"]  # H2O's own default
        return d
