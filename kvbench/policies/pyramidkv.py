"""PyramidKV (Cai et al., 2024): SnapKV's score, with per-layer budgets that shrink from the bottom
layers to the top ones (attention funnels: lower layers spread their attention, upper ones focus it).

The per-layer budgets are the budget rule `pyramid` (kvbench/budgets/pyramid_layers.py: the published schedule of
PyramidKV's code and kvpress 0.5.5's PyramidKVPress, over the layers kvbench compresses, or `budget_rule=window_plus`,
kvbench's earlier rule); this class only picks it (`layer_budget`) and holds its knobs (`beta`, `budget_rule`).
Each layer then holds its own count: the cache keeps one group (count, capacity, mask) per layer, so a layer's
memory is its own budget's, and the memory account follows (kvbench.memory).
"""

from dataclasses import dataclass
from typing import ClassVar

from kvbench.budgets import is_int
from kvbench.errors import ConfigError
from kvbench.policies.snapkv import SnapKV

BUDGET_RULES = ("published", "window_plus")


@dataclass
class PyramidKV(SnapKV):
    beta: int = 20
    budget_rule: str = "published"  # published (PyramidKV's code, kvpress) | window_plus (kvbench's earlier rule)
    name: ClassVar[str] = "pyramidkv"
    label: ClassVar[str] = "PyramidKV"
    summary: ClassVar[str] = "SnapKV's score, with per-layer budgets shrinking from the bottom layer up"
    paper: ClassVar[tuple[str, str]] = ("Cai et al., 2024", "https://arxiv.org/abs/2406.02069")
    layer_budget: ClassVar[str] = "pyramid"  # kvbench/budgets/pyramid_layers.py

    def validate(self) -> None:
        if not is_int(self.beta) or self.beta < 1:
            raise ConfigError("policy.beta", "must be an integer >= 1", self.beta)
        if self.budget_rule not in BUDGET_RULES:
            raise ConfigError("policy.budget_rule", f"must be one of {', '.join(BUDGET_RULES)}", self.budget_rule)
        super().validate()
