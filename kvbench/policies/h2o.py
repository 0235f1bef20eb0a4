"""H2O (heavy hitters): score = attention summed over every query so far; the most recent half of
the budget is protected (`protect_recent=null`: half of each sample's budget, kv_size // 2 or, with
`kv_ratio`, half of each prompt's own budget). Originally decoding-only, one pair per step (p = 1);
runs under prefill_and_decode too (listed in `extensions`).
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.budgets import is_int
from kvbench.policies.policy import Needs, Policy, ScoreContext


@dataclass
class H2O(Policy):
    kv_size: int | None = 256
    evict_every: int = 1
    schedule: str = "decode_only"
    protect_recent: int | None = None  # None: half the budget (kv_size // 2, or each sample's own with kv_ratio)
    name: ClassVar[str] = "h2o"
    label: ClassVar[str] = "H2O"
    summary: ClassVar[str] = "attention received, summed; the newest half of the budget protected"
    paper: ClassVar[tuple[str, str]] = ("Zhang et al., NeurIPS 2023", "https://arxiv.org/abs/2306.14048")
    published_schedule: ClassVar[str] = "decode_only"
    published_evict_every: ClassVar[int] = 1
    gqa_note: ClassVar[str] = ("gqa_group_mean: the attention a pair receives is averaged over the query heads of "
                               "its KV group (published on multi-head models)")
    needs: ClassVar[Needs] = Needs(attention=True)

    def validate(self) -> None:
        if self.protect_recent is None and self.per_prompt is None and is_int(self.kv_size):
            self.protect_recent = self.kv_size // 2
        if self.protect_recent is None:  # a per-prompt budget: half of each sample's own (recent_pairs)
            self.protect_recent = 0  # validated as "nothing fixed" (the YAML's kv_size plays no part)
            try:
                super().validate()
            finally:
                self.protect_recent = None
        else:
            super().validate()

    def score(self, stats: ScoreContext) -> torch.Tensor:
        return stats.sum_w

    def describe(self, gqa: bool = False, paged: bool = False) -> dict:
        d = super().describe(gqa, paged)
        if self.kv_size is not None:  # H2O's own default (half the budget) is no departure
            d["extensions"] = [e for e in d["extensions"] if e != f"protect_recent={self.kv_size // 2}"]
        return d
