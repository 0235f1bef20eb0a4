"""The pyramid layer rule (PyramidKV, Cai et al., 2024): per-layer budgets that shrink from the bottom layers to the
top ones, as PyramidKV's code (KVCache-Factory's `pyramidkv_utils.py`) and kvpress 0.5.5's PyramidKVPress compute it.

For a prompt of q tokens whose budget is m pairs per layer (kvpress's q x (1 - compression_ratio), unrounded; or
kv_size / the kv_ratio budget), the policy's observation window W (`policy.window`) and `policy.beta` (20):

    min = m / beta,   max = 2 m - min;   if max >= q - W:  max = q - W,  min = 2 m - max
    if not (q >= max >= min >= W):  every layer keeps m pairs (kvpress: round(q x (1 - ratio)), "SnapKV")
    else:  layer l keeps round(max - l (max - min) / (L - 1)) pairs, the window's among them

so the layers' budgets average m (one layer: m; PyramidKV's code divides by L - 1). L counts the layers the policy
compresses (kvbench.budgets.knobs.layer_budgets: the full-attention ones). A layer budget below `min_budget` (p + the
window + the sinks + 1) is raised to it (kvbench evicts p pairs at a time; under after_prefill, kvpress's protocol,
nothing is raised). `policy.budget_rule=window_plus`: kvbench's earlier rule (W plus a pyramid of the other pairs
from (m - W) / beta, integer budgets summing exactly to m x layers).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from kvbench.budgets.knobs import min_budget
from kvbench.budgets.rule import LayerRule


class PyramidLayers(LayerRule):
    name: ClassVar[str] = "pyramid"
    label: ClassVar[str] = "PyramidKV"
    varies: ClassVar[bool] = True

    def budgets(self, policy, per_sample: torch.Tensor, layers: int, lengths: list[int]) -> torch.Tensor:
        if policy.budget_rule == "window_plus":
            return window_plus(policy, per_sample, layers)
        rows = [published(policy, int(k), q, layers) for k, q in zip(per_sample.tolist(), lengths, strict=True)]
        return torch.tensor(rows, dtype=torch.long, device="cpu").T.contiguous()

    def extensions(self, policy) -> list[str]:
        k, W, least = policy.kv_size, policy.window, min_budget(policy)
        if policy.budget_rule == "window_plus":
            ext = ["budget_rule=window_plus: the window in every layer plus a pyramid of the other pairs from (budget "
                   "- window) / beta, summing exactly to budget x layers (published: a pyramid of the whole budget, "
                   "capped at prompt - window)"]
            if k is not None and (k - W) / policy.beta < least - W:
                ext.append(f"the top layers' budget raised to min_budget={least} (kvbench evicts {policy.evict_every} "
                           "pairs at a time), the bottom layers' lowered")
            return ext
        if not policy.once and (k is None or k / policy.beta < least):
            return [f"no layer budget below min_budget={least} (kvbench evicts {policy.evict_every} pairs at a time; "
                    "published: down to budget / beta)"]
        return []

    def describe(self, policy) -> str:
        return f"per-layer budgets from bottom to top, beta={policy.beta}, rule={policy.budget_rule}"


def published(policy, k: int, q: int, layers: int) -> list[int]:
    """One prompt's layer budgets under the published schedule (module docstring)."""
    W, cr, least = policy.window, policy.compression_ratio, min_budget(policy)
    m = q * (1 - cr) if cr is not None else float(k)
    lo = m / policy.beta
    hi = 2 * m - lo
    if hi >= q - W:
        hi = q - W
        lo = 2 * m - hi
    if layers == 1 or not (q >= hi >= lo >= W):  # SnapKV's budget in every layer (one layer: its mean)
        return [max(least, max(1, round(m)) if cr is not None else k)] * layers
    steps = (hi - lo) / (layers - 1)
    return [max(least, round(hi - layer * steps)) for layer in range(layers)]


def window_plus(policy, per_sample: torch.Tensor, layers: int) -> torch.Tensor:
    """kvbench's earlier rule: (L, B) budgets, W in every layer plus a pyramid of the rest, summing to L x k."""
    k = per_sample.to(torch.float64)  # (B,)
    W = policy.protect_recent  # the window's pairs (protected), inside every layer's budget
    floor = min_budget(policy) - W  # the fewest selected pairs a layer may hold
    lo = torch.maximum((k - W) / policy.beta, torch.full_like(k, float(floor)))
    hi = 2 * (k - W) - lo
    if layers == 1:
        return per_sample[None].clone()
    frac = torch.arange(layers, dtype=torch.float64, device="cpu")[:, None] / (layers - 1)  # (L, 1)
    want = W + hi[None] - frac * (hi - lo)[None]  # (L, B), sums to L x k
    want = torch.where((hi >= lo)[None], want, k[None].expand(layers, -1))  # too small a budget: SnapKV
    out = want.floor()
    short = (k * layers - out.sum(dim=0)).round().long()  # (B,) layers that get one more pair
    rank = torch.argsort(torch.argsort(-(want - out), dim=0, stable=True), dim=0)  # 0 = largest remainder
    return (out + (rank < short[None]).to(out.dtype)).long()
