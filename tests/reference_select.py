"""Brute-force selection rules of the methods of tests/reference_methods.py and reference_passes.py: which
pairs of a layer each KV head keeps, given the scores (lists per KV head, in the cache's order), written from
kvpress 0.5.5 as /work/wt/43-methods-spec.md states it. Each returns, per KV head, the sorted indices kept
(indices into the head's list of pairs). Ties are not broken on purpose (kvpress's topk leaves them open):
the callers' tests use scores without ties at the boundary.
"""

from __future__ import annotations

import math


def n_kept(n: int, ratio: float) -> int:
    """kvpress's kept count for a compression ratio: int(n (1 - ratio)), at least 1 (0 at ratio 1)."""
    return 0 if ratio >= 1 else max(1, int(n * (1 - ratio)))


def best(s: list[float], k: int) -> list[int]:
    return sorted(sorted(range(len(s)), key=lambda i: -s[i])[:k])


def topk(scores: list[list[float]], ratio: float) -> list[list[int]]:
    """ScorerPress: each head its n_kept best."""
    return [best(s, n_kept(len(s), ratio)) for s in scores]


def adakv(scores: list[list[float]], ratio: float, alpha: float = 0.2) -> list[list[int]]:
    """AdaKV: each head's int(n_kept alpha) best (at least 1) first, then the layer's H x n_kept best scores
    over all its heads together; each head keeps what it got."""
    k = n_kept(len(scores[0]), ratio)
    safe = max(1, int(k * alpha)) if alpha > 0 else 0
    flat = []
    for g, s in enumerate(scores):
        first = set(best(s, safe))
        flat += [(math.inf if i in first else v, g, i) for i, v in enumerate(s)]
    chosen = sorted(flat, key=lambda x: -x[0])[: len(scores) * k]
    return [sorted(i for _, g2, i in chosen if g2 == g) for g in range(len(scores))]


def dms(scores: list[list[float]], threshold: float, window: int) -> list[list[int]]:
    """DMS by threshold: the newest `window` pairs are kept; an older pair is evicted if its score is below
    the threshold (kvpress's DMSPress, no sinks)."""
    return [[i for i, v in enumerate(s) if i >= len(s) - window or v >= threshold] for s in scores]


def chunkkv(scores: list[list[float]], ratio: float, length: int) -> list[list[int]]:
    """ChunkKV: chunks of `length` pairs from the first (the last one partial); a chunk's score is the mean
    over its pairs of the score summed over the KV heads; the max(1, int(chunks (1 - ratio))) best chunks
    are kept whole, by every head. Fewer pairs than one chunk: the inner rule (topk)."""
    n = len(scores[0])
    if n < length:
        return topk(scores, ratio)
    summed = [sum(s[i] for s in scores) for i in range(n)]
    chunks = [range(c, min(n, c + length)) for c in range(0, n, length)]
    value = [sum(summed[i] for i in c) / len(c) for c in chunks]
    keep = best(value, max(1, int(len(chunks) * (1 - ratio))))
    kept = sorted(i for c in keep for i in chunks[c])
    return [list(kept) for _ in scores]


def duo_streaming(head_scores: list[list[float]], ratio: float) -> list[list[bool]]:
    """DuoAttention: the round(L x H_kv x ratio) (Python's round, half to even) (layer, KV head) pairs of
    lowest head score are streaming heads."""
    flat = sorted((v, layer, g) for layer, row in enumerate(head_scores) for g, v in enumerate(row))
    n = round(len(flat) * ratio)
    streaming = {(layer, g) for _, layer, g in flat[:n]}
    return [[(layer, g) in streaming for g in range(len(row))] for layer, row in enumerate(head_scores)]


def duo_kept(n: int, streaming: list[bool], sink: int, recent: int) -> list[list[int]]:
    """A streaming head keeps its first `sink` and last `recent` pairs, a retrieval head every pair."""
    return [[i for i in range(n) if not s or i < sink or i >= n - recent] for s in streaming]


def kvzip(table: list[list[list[float]]], ratio: float, n_sink: int = 4, layerwise: bool = False):
    """KVzip's eviction over its score table [layer][kv_head][pair]: the first n_sink pairs of every head
    raised above every score; then, by default, the int(L H n ratio) lowest of the whole table evicted
    (layers and heads compete); layerwise: int(H n ratio) per layer, its heads competing. Returns
    kept[layer][kv_head] = sorted indices."""
    top = max(v for layer in table for row in layer for v in row) + 1.0
    s = [[[top if i < n_sink else v for i, v in enumerate(row)] for row in layer] for layer in table]
    heads, n = len(s[0]), len(s[0][0])
    groups = [[(layer,) for layer in range(len(s))]] if not layerwise else [[(layer,)] for layer in range(len(s))]
    gone = set()
    for group in groups:
        flat = sorted((s[la][g][i], la, g, i) for (la,) in group for g in range(heads) for i in range(n))
        gone |= {(la, g, i) for _, la, g, i in flat[: int(len(group) * heads * n * ratio)]}
    return [[[i for i in range(n) if (la, g, i) not in gone] for g in range(heads)] for la in range(len(s))]
