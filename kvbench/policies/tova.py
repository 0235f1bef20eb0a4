"""TOVA (Oren et al., 2024): keep the pairs the newest query attends to most. Decoding-only by
default, one pair per step.

Published rule (the default): the newest query's attention averaged over ALL query heads of the
layer, so every KV head of a layer gets the same scores and evicts the same positions (all heads of a
sample then hold the same positions at every slot, which is what makes the per-slot mean over heads
a per-position mean). `per_kv_head=true`: kvbench's earlier variant, each KV head ranked by the mean
over its own GQA group (heads evict different positions), listed in `extensions`.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.policies.policy import Needs, Policy, ScoreContext


@dataclass
class TOVA(Policy):
    kv_size: int | None = 256
    evict_every: int = 1
    schedule: str = "decode_only"
    per_kv_head: bool = False
    name: ClassVar[str] = "tova"
    label: ClassVar[str] = "TOVA"
    summary: ClassVar[str] = "the newest query's attention, averaged over the layer's query heads"
    paper: ClassVar[tuple[str, str]] = ("Oren et al., 2024", "https://arxiv.org/abs/2401.06104")
    published_schedule: ClassVar[str] = "decode_only"
    published_evict_every: ClassVar[int] = 1
    needs: ClassVar[Needs] = Needs(attention=True)

    def score(self, stats: ScoreContext) -> torch.Tensor:
        if self.per_kv_head:
            return stats.last_w  # (L, B, H, N): each KV head its own group's mean
        # the mean over KV heads of the group means = the mean over all query heads (equal groups)
        return stats.last_w.mean(dim=2, keepdim=True).expand_as(stats.last_w)

    def describe(self, gqa: bool = False, paged: bool = False) -> dict:
        d = super().describe(gqa, paged)
        if self.per_kv_head and self.evicts:
            d["extensions"].append("per_kv_head: scores per KV head (GQA group mean), heads evict different "
                                   "positions (published TOVA averages all heads of a layer)")
        return d
