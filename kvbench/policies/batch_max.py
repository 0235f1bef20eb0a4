"""Batch-Max: the average-attention rule, evicting block-wise during prefill and decode.

ave[i] = sum_w[i] / (last + 1 - pos[i]): the attention pair i received, averaged over the queries
that could attend it (its own included). Dividing by the age removes H2O's bias towards old pairs
without a protected window. Default schedule: prefill_and_decode (Algorithm 1), p = 64.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.policies.policy import Needs, Policy, ScoreContext


@dataclass
class BatchMax(Policy):
    kv_size: int | None = 1024
    evict_every: int = 64
    schedule: str = "prefill_and_decode"
    name: ClassVar[str] = "batch_max"
    label: ClassVar[str] = "BM"
    summary: ClassVar[str] = "attention received / queries that could attend it (the average rule)"
    paper: ClassVar[tuple[str, str]] = ("Metel et al., ES-FoMo @ ICML 2025", "https://arxiv.org/abs/2412.05693")
    published_schedule: ClassVar[str] = "prefill_and_decode"
    gqa_note: ClassVar[str] = "gqa_group_mean: the attention a pair receives is averaged over the query heads of its KV group (published on multi-head models)"
    needs: ClassVar[Needs] = Needs(attention=True)

    def score(self, stats: ScoreContext) -> torch.Tensor:
        queries = (stats.last + 1 - stats.pos).clamp(min=1).float()  # (L, B, H, N)
        return stats.sum_w / queries
