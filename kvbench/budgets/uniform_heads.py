"""The uniform head rule (`head_budget=uniform`, the default): every KV head of a (layer, sample) holds the layer's
budget, so an eviction keeps each head's `keep` best pairs and a head needs no more slots than its budget."""

from __future__ import annotations

from typing import ClassVar

from kvbench.budgets.rule import HeadRule


class UniformHeads(HeadRule):
    name: ClassVar[str] = "uniform"
