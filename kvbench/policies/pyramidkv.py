"""PyramidKV (Cai et al., 2024): SnapKV's score, with per-layer budgets that shrink from the bottom
layers to the top ones (attention funnels: lower layers spread their attention, upper ones focus it).

Published schedule (PyramidKV's code; kvpress's PyramidKVPress): with a budget of k pairs per layer, an
observation window of W and beta = 20, the selected (non-window) pairs of layer l are

    max - l * (max - min) / (L - 1),   min = (k - W) / beta,   max = 2 (k - W) - min,

plus the W window pairs, so the layers' budgets average k: the total is k x layers, SnapKV's. Here the
budgets are integers that sum exactly to k x layers (the rounding remainder goes to the layers with the
largest fractional parts). A layer budget is never below `min_budget` (evict_every + the window + the
sinks + 1: kvbench evicts p pairs at a time); when min is below it, it is raised to it and max lowered to
keep the total (listed in `extensions`), and when even that is impossible every layer gets k (SnapKV),
as kvpress falls back. With `kv_ratio`, k is each sample's own budget and the schedule is per sample.

Each layer then holds its own count: the cache keeps one group (count, capacity, mask) per layer, so a
layer's memory is its own budget's, and the memory account follows (kvbench.memory).
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.errors import ConfigError
from kvbench.policies.base import _is_int
from kvbench.policies.snapkv import SnapKV


@dataclass
class PyramidKV(SnapKV):
    beta: int = 20
    name: ClassVar[str] = "pyramidkv"

    def validate(self) -> None:
        if not _is_int(self.beta) or self.beta < 1:
            raise ConfigError("policy.beta", "must be an integer >= 1", self.beta)
        super().validate()
        if self.rerotate:
            raise ConfigError("policy.rerotate", "needs the same budget in every layer (rotary positions are shared "
                              "by all layers); PyramidKV's budgets differ by layer", self.rerotate)

    def layer_budgets(self, per_sample: torch.Tensor, layers: int) -> torch.Tensor:
        k = per_sample.to(torch.float64)  # (B,)
        W = self.protect_recent  # the window's pairs (protected), inside every layer's budget
        floor = self.min_budget - W  # the fewest selected pairs a layer may hold
        lo = (k - W) / self.beta
        lo = torch.maximum(lo, torch.full_like(lo, float(floor)))
        hi = 2 * (k - W) - lo
        if layers == 1:
            return per_sample[None].clone()
        frac = torch.arange(layers, dtype=torch.float64)[:, None] / (layers - 1)  # (L, 1)
        want = W + hi[None] - frac * (hi - lo)[None]  # (L, B), sums to L x k
        want = torch.where((hi >= lo)[None], want, k[None].expand(layers, -1))  # too small a budget: SnapKV
        out = want.floor()
        short = (k * layers - out.sum(dim=0)).round().long()  # (B,) layers that get one more pair
        rank = torch.argsort(torch.argsort(-(want - out), dim=0, stable=True), dim=0)  # 0 = largest remainder
        out = out + (rank < short[None]).to(out.dtype)
        return out.long()

    def describe(self, gqa: bool = False, paged: bool = False) -> dict:
        d = super().describe(gqa, paged)
        k = self.kv_size
        note = f"per-layer budgets from bottom to top, beta={self.beta}, averaging the budget"
        if k is not None:
            b = self.layer_budgets(torch.tensor([k]), 2)[:, 0].tolist()
            note += f" (kv_size={k}: {b[0]} in the first layer, {b[1]} in the last)"
            if (k - self.protect_recent) / self.beta < self.min_budget - self.protect_recent:
                d["extensions"].append(
                    f"the top layers' budget raised to min_budget={self.min_budget} (published (kv_size - window) / "
                    f"beta + window = {(k - self.protect_recent) / self.beta + self.protect_recent:g}: kvbench "
                    f"evicts {self.evict_every} pairs at a time), the bottom layers' lowered to keep the total")
        d["budgets"] = note
        return d
