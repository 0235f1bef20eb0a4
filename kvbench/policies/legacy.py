"""The budget methods `Policy` had before budgets became their own room (kvbench.budgets), kept as thin
delegations so code not yet moved to `kvbench.budgets` still runs (kvbench.memory, kvbench.config's serve
check, kvbench.search/plan through them, tests). New code calls `kvbench.budgets` directly; this mixin goes
once no caller is left.
"""

from __future__ import annotations

import torch

from kvbench.budgets import Budgets, rules


class LegacyBudgetCalls:
    """Delegations to `kvbench.budgets.rules` (each one line); `heads`: the model's KV heads, needed only under
    adaptive head budgets."""

    def keep(self, budget):
        return rules.keep(self, budget)

    @property
    def keep_after_evict(self) -> int:
        assert self.kv_size is not None
        return rules.keep(self, self.kv_size)

    @property
    def min_budget(self) -> int:
        return rules.min_budget(self)

    def recent_pairs(self, budgets: torch.Tensor) -> torch.Tensor:
        return rules.recent_pairs(self, budgets)

    def sample_budgets(self, lengths: list[int]) -> torch.Tensor:
        return rules.sample_budgets(self, lengths)

    def budgets(self, lengths: list[int], layers: int) -> torch.Tensor | None:
        return rules.layer_budgets(self, lengths, layers)

    def head_budgets(self, lengths: list[int], layers: int, heads: int) -> Budgets | None:
        return Budgets.of(self, lengths, layers, heads)

    def capacities(self, lengths: list[int], max_new_tokens: int, budgets: torch.Tensor | None,
                   heads: int | None = None) -> list[int]:
        return rules.capacities(self, lengths, max_new_tokens, budgets, heads)

    def decode_capacity(self, budget: int, max_new_tokens: int, heads: int | None = None) -> int:
        return rules.decode_capacity(self, budget, max_new_tokens, heads)
