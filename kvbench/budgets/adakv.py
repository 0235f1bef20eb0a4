"""AdaKV's allocation rule (Feng et al., 2024, "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget
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
"""

from __future__ import annotations

import torch

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
