"""PyramidKV (Cai et al., 2024): SnapKV's score, with per-layer budgets that shrink from the bottom
layers to the top ones (attention funnels: lower layers spread their attention, upper ones focus it).

Published schedule (PyramidKV's code, KVCache-Factory's `pyramidkv_utils.py`, as kvpress 0.5.5's
PyramidKVPress computes it), for a prompt of q tokens whose budget is m pairs per layer (kvpress's
q x (1 - compression_ratio), unrounded; or kv_size / the kv_ratio budget), a window W and beta (20):

    min = m / beta,   max = 2 m - min;   if max >= q - W:  max = q - W,  min = 2 m - max
    if not (q >= max >= min >= W):  every layer keeps m pairs (kvpress: round(q x (1 - ratio)), "SnapKV")
    else:  layer l keeps round(max - l (max - min) / (L - 1)) pairs, the window's among them

so the layers' budgets average m (one layer: m; PyramidKV's code divides by L - 1). The pyramid spans the
layers kvbench compresses: on a model with sliding-window layers, its full-attention layers only (the windowed
ones hold their window), so the compressed layers' budgets average m there too. kvbench evicts p pairs at a
time under prefill_and_decode and decode_only: a layer budget below `min_budget` (p + the window + the sinks
+ 1) is raised to it (`extensions` says so; under after_prefill, kvpress's protocol, nothing is raised).
`budget_rule=window_plus`: kvbench's earlier rule (W plus a pyramid of the other pairs from (m - W) / beta,
integer budgets summing exactly to m x layers), labelled in `extensions`.

Each layer then holds its own count: the cache keeps one group (count, capacity, mask) per layer, so a
layer's memory is its own budget's, and the memory account follows (kvbench.memory).
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.budgets import rules
from kvbench.errors import ConfigError
from kvbench.policies.base import _is_int
from kvbench.policies.snapkv import SnapKV

BUDGET_RULES = ("published", "window_plus")


@dataclass
class PyramidKV(SnapKV):
    beta: int = 20
    budget_rule: str = "published"  # published (PyramidKV's code, kvpress) | window_plus (kvbench's earlier rule)
    name: ClassVar[str] = "pyramidkv"
    summary: ClassVar[str] = "SnapKV's score, with per-layer budgets shrinking from the bottom layer up"
    paper: ClassVar[tuple[str, str]] = ("Cai et al., 2024", "https://arxiv.org/abs/2406.02069")

    def validate(self) -> None:
        if not _is_int(self.beta) or self.beta < 1:
            raise ConfigError("policy.beta", "must be an integer >= 1", self.beta)
        if self.budget_rule not in BUDGET_RULES:
            raise ConfigError("policy.budget_rule", f"must be one of {', '.join(BUDGET_RULES)}", self.budget_rule)
        super().validate()
        if self.rerotate:
            raise ConfigError("policy.rerotate", "needs the same budget in every layer (rotary positions are shared "
                              "by all layers); PyramidKV's budgets differ by layer", self.rerotate)

    def layer_budgets(self, per_sample: torch.Tensor, layers: int, lengths: list[int] | None = None) -> torch.Tensor:
        """(L, B) budgets: the published schedule of each sample's prompt (`lengths`), or window_plus."""
        if self.budget_rule == "window_plus" or lengths is None:
            return self._window_plus(per_sample, layers)
        rows = [self._published(int(k), q, layers) for k, q in zip(per_sample.tolist(), lengths, strict=True)]
        return torch.tensor(rows, dtype=torch.long, device="cpu").T.contiguous()

    def _published(self, k: int, q: int, layers: int) -> list[int]:
        """One prompt's layer budgets under the published schedule (module docstring)."""
        W = self.window
        cr = self.compression_ratio
        m = q * (1 - cr) if cr is not None else float(k)
        lo = m / self.beta
        hi = 2 * m - lo
        if hi >= q - W:
            hi = q - W
            lo = 2 * m - hi
        if layers == 1 or not (q >= hi >= lo >= W):  # SnapKV's budget in every layer (one layer: its mean)
            return [max(rules.min_budget(self), max(1, round(m)) if cr is not None else k)] * layers
        steps = (hi - lo) / (layers - 1) if layers > 1 else 0.0
        return [max(rules.min_budget(self), round(hi - layer * steps)) for layer in range(layers)]

    def _window_plus(self, per_sample: torch.Tensor, layers: int) -> torch.Tensor:
        k = per_sample.to(torch.float64)  # (B,)
        W = self.protect_recent  # the window's pairs (protected), inside every layer's budget
        floor = rules.min_budget(self) - W  # the fewest selected pairs a layer may hold
        lo = (k - W) / self.beta
        lo = torch.maximum(lo, torch.full_like(lo, float(floor)))
        hi = 2 * (k - W) - lo
        if layers == 1:
            return per_sample[None].clone()
        frac = torch.arange(layers, dtype=torch.float64, device="cpu")[:, None] / (layers - 1)  # (L, 1)
        want = W + hi[None] - frac * (hi - lo)[None]  # (L, B), sums to L x k
        want = torch.where((hi >= lo)[None], want, k[None].expand(layers, -1))  # too small a budget: SnapKV
        out = want.floor()
        short = (k * layers - out.sum(dim=0)).round().long()  # (B,) layers that get one more pair
        rank = torch.argsort(torch.argsort(-(want - out), dim=0, stable=True), dim=0)  # 0 = largest remainder
        out = out + (rank < short[None]).to(out.dtype)
        return out.long()

    def describe(self, gqa: bool = False, paged: bool = False) -> dict:
        d = super().describe(gqa, paged)
        k, W = self.kv_size, self.window
        if self.budget_rule == "window_plus":
            d["extensions"].append("budget_rule=window_plus: the window in every layer plus a pyramid of the other "
                                   "pairs from (budget - window) / beta, summing exactly to budget x layers "
                                   "(published: a pyramid of the whole budget, capped at prompt - window)")
            if k is not None and (k - W) / self.beta < rules.min_budget(self) - W:
                d["extensions"].append(f"the top layers' budget raised to min_budget={rules.min_budget(self)} (kvbench "
                                       f"evicts {self.evict_every} pairs at a time), the bottom layers' lowered")
        elif not self.once and (k is None or k / self.beta < rules.min_budget(self)):
            d["extensions"].append(f"no layer budget below min_budget={rules.min_budget(self)} (kvbench evicts "
                                   f"{self.evict_every} pairs at a time; published: down to budget / beta)")
        d["budgets"] = f"per-layer budgets from bottom to top, beta={self.beta}, rule={self.budget_rule}"
        return d
