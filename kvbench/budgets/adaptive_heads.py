"""The adaptive head rule (`head_budget=adaptive`): AdaKV's allocation (Feng et al., 2024, "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget
Allocation"): a layer keeps its budget x heads pairs, chosen by score across all its KV heads at once, so a
head whose attention is concentrated gives pairs to one whose attention is spread; a safeguard keeps each
head at least a share of the budget.

As kvpress 0.5.5's `AdaKVPress.compress` computes it, for one (layer, sample) of H KV heads keeping k pairs
per head on average, with the safeguard share alpha (`policy.head_floor`, kvpress's `alpha_safeguard`, 0.2):

    n_safe = int(k x alpha)                      each head's n_safe best pairs are kept whatever the others
    then the H x k best of every head's pairs, those n_safe ones counted first (kvpress raises their score
    to the dtype's max, then drops the H x (N - k) lowest over the flattened heads)

A head's kept pairs are then its own c_h best (the rule only decides the counts), so `head_counts` returns
the counts and the cache's selection (kvbench.cache.evict.select) keeps each head's c_h best, as for a
uniform budget. Pure: scores in, counts out; vectorised over layers, samples and heads.

What the engine needs of it (`AdaptiveHeads`): a score (`needs_score`, so not a policy that keeps the newest pairs by
position), one choice when the prompt is compressed (`once_only`: schedule=after_prefill), heads holding different
counts (`uneven`: no re-rotation), and each head at most `slots` = heads x pairs - (heads - 1) x floor pairs (every
other head at its floor): what the cache preallocates and the memory account charges.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from kvbench.budgets.rule import HeadRule
from kvbench.errors import ConfigError

INF = float("inf")
TRANSIENT_BYTES = 4 + 8 + 4 + 4 + 12 + 8 + 8  # the float copy, sort indices, the ranked copy, its scatter, the
# flattened sort (values and indices), the heads of the flattened order, the chosen counts (int64)


def floors(keep: torch.Tensor, share: float) -> torch.Tensor:
    """(B,) pairs every head keeps at least: int(keep x share) (kvpress's n_safe)."""
    return (keep.to(torch.float64) * share).floor().to(torch.long)


def head_counts(score: torch.Tensor, keep: torch.Tensor, share: float) -> torch.Tensor:
    """(L, B, H) pairs each KV head keeps; every (layer, sample) row sums to H x keep_b.

    score: (L, B, H, N) float, higher = keep: protected pairs +inf, empty slots -inf (as the cache's `select`
    ranks them); keep: (B,) pairs per head on average, each below every head's held count (on the score's
    device); share: the safeguard alpha in [0, 1]. Ties rank as in `select` (a stable ascending sort: the newer
    slot, then the later head, ranks higher), a fixed choice where kvpress's topk leaves it unspecified.
    Transient: about `TRANSIENT_BYTES` per (layer, sample, head, pair).
    """
    L, B, H, N = score.shape
    keep = keep.to(device=score.device, dtype=torch.long)
    s = score.float()
    # the safeguard: each head's int(k x alpha) best pairs rank above everything else (+inf, like protected)
    order = torch.sort(s, dim=-1, stable=True).indices  # (L, B, H, N) ascending: the best last
    ranked = s.gather(-1, order)
    ranked.masked_fill_(torch.arange(N, device=s.device) >= N - floors(keep, share)[None, :, None, None], INF)
    s = torch.empty_like(s).scatter_(-1, order, ranked)
    del order, ranked
    # the H x k best over the layer's heads (flattened head-major, slot order inside a head)
    flat = torch.sort(s.view(L, B, H * N), dim=-1, stable=True).indices  # (L, B, H N) ascending
    del s
    chosen = torch.arange(H * N, device=flat.device) >= H * N - H * keep[None, :, None]  # (1, B, H N) by rank
    counts = torch.zeros(L, B, H, dtype=torch.long, device=flat.device)
    return counts.scatter_add_(-1, flat // N, chosen.expand(L, B, H * N).long())


class AdaptiveHeads(HeadRule):
    name: ClassVar[str] = "adaptive"
    needs_score: ClassVar[bool] = True
    once_only: ClassVar[bool] = True
    uneven: ClassVar[bool] = True
    transient: ClassVar[int] = 8 + TRANSIENT_BYTES  # the ranked scores' copy, then `head_counts`'s own

    def validate(self, policy) -> None:
        hb = policy.head_budget
        if policy.keeps_newest:
            raise ConfigError("policy.head_budget", f"{policy.name} keeps the newest pairs by position: adaptive head "
                              "budgets need a score that differs by head", hb)
        if not policy.once:
            raise ConfigError("policy.head_budget", "adaptive head budgets are chosen once, when the prompt is "
                              "compressed after prefill (AdaKV's protocol): use policy.schedule=after_prefill", hb)
        if policy.rerotate:
            raise ConfigError("policy.head_budget", "adaptive head budgets give heads different counts; "
                              "policy.rerotate needs one count (rotary positions are shared)", hb)

    def slots(self, policy, pairs, heads: int | None):
        """heads x pairs - (heads - 1) x floor: every other head at its floor int(pairs x head_floor) (kvpress's
        `n_safe`). `heads=None`: ValueError (the bound depends on the model's KV heads)."""
        if heads is None:
            raise ValueError("head_budget=adaptive: the slots a head may hold depend on the KV heads (pass heads=)")
        if isinstance(pairs, torch.Tensor):
            floor = (pairs.double() * policy.head_floor).floor().long()
        else:
            floor = int(pairs * policy.head_floor)
        return heads * pairs - (heads - 1) * floor

    def counts(self, policy, ranked: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return head_counts(ranked, keep, policy.head_floor)

    def extensions(self, policy) -> list[str]:
        return [f"head_budget=adaptive: AdaKV's allocation (kvpress's AdaKVPress): a layer keeps budget x KV heads "
                f"pairs chosen by score across its heads, each head at least int(budget x {policy.head_floor:g}) "
                "(head_floor, kvpress's alpha_safeguard); the cache holds each head's pairs packed, its memory sized "
                "by the largest head (kvpress keeps every pair and masks the evicted keys)"]
