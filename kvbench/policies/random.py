"""Random eviction: seeded uniform scores, the floor every method must beat.

Reproducible without a generator's state: the score of a pair is a hash of (seed, layer, KV head,
position, the sample's last processed position) mapped to [0, 1), so every eviction draws afresh,
heads and layers draw independently, and a sample's draws do not depend on the batch it is in
(batch 1 and a padded batch keep the same pairs). 31-bit integer arithmetic, exact on any device.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.policies.policy import AFTER_PREFILL, Policy, ScoreContext

MASK = 0x7FFFFFFF  # products of a 31-bit value and a 31-bit multiplier stay below 2**62: no int64 overflow


def mix(x: torch.Tensor) -> torch.Tensor:
    """A 31-bit integer hash (xorshift-multiply rounds) of int64 values in [0, 2**31)."""
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & MASK
    x = x ^ (x >> 12)
    x = (x * 0x297A2D39) & MASK
    return x ^ (x >> 15)


@dataclass
class Random(Policy):
    kv_size: int | None = 256
    evict_every: int = 64
    schedule: str = "decode_only"
    seed: int = 0
    name: ClassVar[str] = "random"
    label: ClassVar[str] = "Random"
    summary: ClassVar[str] = "a seeded uniform score: the floor every method must beat"
    published_schedule: ClassVar[str] = AFTER_PREFILL

    def score(self, stats: ScoreContext) -> torch.Tensor:
        L, B, H, N = stats.pos.shape
        head = torch.arange(H, device=stats.pos.device)[None, None, :, None]
        x = mix(torch.full((1, 1, 1, 1), self.seed & MASK, dtype=torch.long, device=stats.pos.device))
        for v in (stats.layers, head, stats.last, stats.pos):  # chained: hash(hash(...) + v)
            x = mix((x + v.long()) & MASK)
        return x.float() / 2**31  # (L, B, H, N) in [0, 1)
