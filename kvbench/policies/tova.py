"""TOVA: keep the pairs the newest query attends to most (score = its attention row, averaged over
the query heads of a KV group). Decoding-only by default, one pair per step.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.policies.base import Policy, ScoreStats


@dataclass
class TOVA(Policy):
    kv_size: int | None = 256
    evict_every: int = 1
    schedule: str = "decode_only"
    name: ClassVar[str] = "tova"
    needs_attention: ClassVar[bool] = True

    def score(self, stats: ScoreStats) -> torch.Tensor:
        return stats.last_w
