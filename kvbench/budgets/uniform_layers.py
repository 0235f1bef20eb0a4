"""The uniform layer rule (every policy's but PyramidKV's): every layer of a sample holds the sample's budget."""

from __future__ import annotations

from typing import ClassVar

from kvbench.budgets.rule import LayerRule


class UniformLayers(LayerRule):
    name: ClassVar[str] = "uniform"
