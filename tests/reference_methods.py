"""Brute-force reference scores of the methods scored from values, hidden states, pre-RoPE projections or
their statistics (ExpectedAttention, LagKV, leverage, non-causal attention, Compactor, KVzap, CriticalKV),
written from the papers as kvpress 0.5.5 states them (/work/wt/43-methods-spec.md), not from kvbench's code.

Plain loops over heads and pairs on tests/reference.py's decoder: `heads` is one layer's cache (a list per KV
head of `Pair`s in position order: pos, k with RoPE, v), `hidden` that layer's record of every position
processed, [(pos, h)], h the hidden state entering attention (after the layer's input norm), which
`ReferenceModel.hidden` keeps. Each function returns the score of every held pair, per KV head, in the
cache's order; higher = keep. Selection rules over these scores are in tests/reference_select.py.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def pre_rope(ref, layer: int, h: torch.Tensor, which: str) -> torch.Tensor:
    """The query ("q": (Hq, D)) or key ("k": (Hkv, D)) projection of h, before RoPE."""
    lw = ref.layers[layer]
    heads = ref.Hq if which == "q" else ref.Hkv
    return F.linear(h, lw[f"w{which}"], lw[f"b{which}"]).view(heads, ref.D)


def rotation(ref, pos: int) -> torch.Tensor:
    """RoPE at `pos` as a (D, D) matrix R, R @ x = the reference decoder's rotation of x."""
    return ref._rope(torch.eye(ref.D, dtype=ref.dtype), pos).T


def hidden_at(hidden, positions) -> list[torch.Tensor]:
    at = dict(hidden)
    return [at[p] for p in positions]


def expected_attention(ref, layer, heads, hidden, n_future=512, n_sink=4, use_covariance=True, use_vnorm=True,
                       epsilon=0.0) -> list[list[float]]:
    """ExpectedAttention: the queries seen (all but the first n_sink processed) give a Gaussian per query
    head (mean, covariance / N) before RoPE; both rotated by the mean of the RoPE matrices of the next
    n_future positions; a pair's logit is mu.k / sqrt(D) + k^T cov k / (2 D), softmax over the held pairs but
    the first n_sink, mean over the group, times ||v|| (after + epsilon); the first n_sink pairs score the
    layer's largest score + 1."""
    seen = [h for _, h in sorted(hidden)][n_sink:]
    nxt = max(p for p, _ in hidden) + 1
    qs = torch.stack([pre_rope(ref, layer, h, "q") for h in seen])  # (N, Hq, D)
    rbar = sum(rotation(ref, t) for t in range(nxt, nxt + n_future)) / n_future  # (D, D)
    out = []
    for g, pairs in enumerate(heads):
        rest = pairs[n_sink:]
        acc = [0.0] * len(rest)
        for j in range(ref.G):
            hq = g * ref.G + j
            mu = qs[:, hq].mean(0)
            cov = sum(torch.outer(q - mu, q - mu) for q in qs[:, hq]) / len(qs)
            mu, cov = rbar @ mu, rbar @ cov @ rbar.T
            logit = torch.stack([mu @ pr.k / math.sqrt(ref.D) + (pr.k @ cov @ pr.k / ref.D / 2 if use_covariance
                                                                  else 0.0) for pr in rest])
            for i, w in enumerate(torch.softmax(logit, 0).tolist()):
                acc[i] += w / ref.G
        if use_vnorm:
            acc = [(a + epsilon) * float(pr.v.norm()) for a, pr in zip(acc, rest, strict=True)]
        out.append(acc)
    top = max(max(s) for s in out) + 1
    return [[top] * min(n_sink, len(pairs)) + s for s, pairs in zip(out, heads, strict=True)]


def lagkv(ref, heads, n_sink=4, lag=128) -> list[list[float]]:
    """LagKV: after n_sink, partitions of `lag` pairs; a pair of partition p scores the softmax over its
    partition of the std over channels of its key (and, averaged, its value) min-max scaled by partition
    p + 1's channel ranges, then replaced by its rank in the partition / lag. Sinks, the last full partition
    and the remainder score 1. Too short a cache (< n_sink + 2 lag): 1 for sinks, (i - n_sink)/(n - n_sink)
    after (a sliding window)."""
    out = []
    for pairs in heads:
        n = len(pairs)
        if n < n_sink + 2 * lag:
            out.append([1.0 if i < n_sink else (i - n_sink) / (n - n_sink) for i in range(n)])
            continue
        parts = (n - n_sink) // lag
        score = [1.0] * n
        for p in range(parts - 1):
            idx = range(n_sink + p * lag, n_sink + (p + 1) * lag)
            nxt = range(n_sink + (p + 1) * lag, n_sink + (p + 2) * lag)
            both = []
            for field in ("k", "v"):
                ref_rows = torch.stack([getattr(pairs[i], field) for i in nxt])  # (lag, D)
                lo, hi = ref_rows.min(0).values, ref_rows.max(0).values
                sd = torch.stack([((getattr(pairs[i], field) - lo) / (hi - lo)).std() for i in idx])
                both.append(torch.softmax(sd, 0))
            s = ((both[0] + both[1]) / 2).tolist()
            for a, i in enumerate(idx):
                score[i] = sum(1 for b in s if b < s[a]) / lag  # its rank in the partition
        out.append(score)
    return out


def leverage(ref, layer, heads, hidden, sketch: torch.Tensor) -> list[list[float]]:
    """Leverage scores of the pre-RoPE keys (from each pair's hidden state), per KV head: keys centred over
    the pairs, times the head's Gaussian sketch (D, k) / sqrt(k) -> X (n, k); score_i = x_i^T (X^T X +
    0.01 I)^-1 x_i, at least 0; z-scored over every head's pairs together (std with n - 1, at least 1e-6)."""
    raw = []
    for g, pairs in enumerate(heads):
        keys = torch.stack([pre_rope(ref, layer, h, "k")[g] for h in hidden_at(hidden, [p.pos for p in pairs])])
        x = (keys - keys.mean(0)) @ sketch[g].to(keys.dtype) / math.sqrt(sketch.shape[-1])
        inv = torch.linalg.inv(x.T @ x + 1e-2 * torch.eye(x.shape[1], dtype=x.dtype))
        raw.append([max(0.0, float(r @ inv @ r)) for r in x])
    return zscore(raw)


def zscore(rows: list[list[float]]) -> list[list[float]]:
    flat = torch.tensor([v for r in rows for v in r], dtype=torch.float64)
    mean, std = float(flat.mean()), max(float(flat.std()), 1e-6)
    return [[(v - mean) / std for v in r] for r in rows]


def non_causal_attention(ref, layer, heads, hidden, chunk=256) -> list[list[float]]:
    """Compactor's attention term: the held pairs cut in chunks of `chunk` (the last one padded with zero
    queries and keys); in a chunk every query (RoPE at its position) attends to every key of the chunk,
    unscaled, softmax in float32 (padded keys' logits -1e-9, padded queries' logits 0 to real keys); a key's
    score is the sum of its weights over the chunk's queries (padded ones too), mean over the group, times
    ||v||, averaged with its two neighbours (zeros outside, / 3), z-scored over every head's pairs."""
    raw = []
    for g, pairs in enumerate(heads):
        n = len(pairs)
        hs = hidden_at(hidden, [p.pos for p in pairs])
        acc = [0.0] * n
        for j in range(ref.G):
            hq = g * ref.G + j
            qs = [ref._rope(pre_rope(ref, layer, h, "q"), p.pos)[hq] for h, p in zip(hs, pairs, strict=True)]
            for c0 in range(0, n, chunk):
                real = range(c0, min(n, c0 + chunk))
                pad = c0 + chunk - real.stop
                for i in list(real) + [None] * pad:
                    logit = [float(qs[i] @ pairs[m].k) if i is not None else 0.0 for m in real] + [-1e-9] * pad
                    w = torch.softmax(torch.tensor(logit, dtype=torch.float32), 0).tolist()
                    for m, wm in zip(real, w, strict=False):
                        acc[m] += wm / ref.G
        s = [a * float(p.v.norm()) for a, p in zip(acc, pairs, strict=True)]
        raw.append([(s[i - 1] if i else 0.0) + s[i] + (s[i + 1] if i + 1 < n else 0.0) for i in range(n)])
        raw[-1] = [v / 3 for v in raw[-1]]
    return zscore(raw)


def compactor(ref, layer, heads, hidden, sketch, ratio, sink_start=8, sink_end=4, chunk=256, blending=None):
    """Compactor: blending (default: the compression ratio) x leverage + non-causal attention, both over the
    pairs between the first sink_start and the last sink_end, which score the largest blend."""
    n = len(heads[0])
    left = min(sink_start, n)
    right = min(sink_end, max(0, n - left))
    mid = [pairs[left : n - right] for pairs in heads]
    b = ratio if blending is None else blending
    lev, att = leverage(ref, layer, mid, hidden, sketch), non_causal_attention(ref, layer, mid, hidden, chunk)
    s = [[b * x + y for x, y in zip(lr, ar, strict=True)] for lr, ar in zip(lev, att, strict=True)]
    top = max(max(r) for r in s)
    return [[top] * left + r + [top] * right for r in s]


def kvzap(cfg: dict, sd: dict, layer: int, heads, hidden) -> list[list[float]]:
    """KVzap: the layer's scorer (a linear map, or Linear-GELU-Linear) of each pair's hidden state; output
    g is KV head g's score (a predicted log KVzip+ score)."""
    p = f"layers.{layer}."
    out = []
    for g, pairs in enumerate(heads):
        row = []
        for h in hidden_at(hidden, [pr.pos for pr in pairs]):
            if cfg["hidden_dim"] is None:
                y = sd[p + "weight"].to(h.dtype) @ h + sd[p + "bias"].to(h.dtype)
            else:
                z = F.gelu(sd[p + "0.weight"].to(h.dtype) @ h + sd[p + "0.bias"].to(h.dtype))
                y = sd[p + "2.weight"].to(h.dtype) @ z + sd[p + "2.bias"].to(h.dtype)
            row.append(float(y[g]))
        out.append(row)
    return out


def value_out_norm(ref, layer: int, g: int, v: torch.Tensor, p: int) -> list[float]:
    """|| W_O^(hq) v ||_p for each query head hq of KV head g's group (W_O's D columns of that head)."""
    wo = ref.layers[layer]["wo"]  # (hidden, Hq x D)
    hqs = range(g * ref.G, (g + 1) * ref.G)
    return [float((wo[:, hq * ref.D : (hq + 1) * ref.D] @ v).norm(p=p)) for hq in hqs]


def critical(ref, layer, heads, inner: list[list[float]], ratio, epsilon=1e-4, first_stage_ratio=0.5):
    """CriticalKV over an inner score: each head's int((1 - ratio) n first_stage_ratio) best (at least 1)
    are kept first (score raised to the float32 maximum); the others score (inner + epsilon) x the mean
    over the group of || W_O^(hq) v ||_1."""
    big = float(torch.finfo(torch.float32).max)
    out = []
    for g, (pairs, s) in enumerate(zip(heads, inner, strict=True)):
        first = max(1, int((1 - ratio) * len(pairs) * first_stage_ratio))
        best = set(sorted(range(len(s)), key=lambda i: -s[i])[:first])  # noqa: B023
        out.append([big if i in best else (s[i] + epsilon) * sum(value_out_norm(ref, layer, g, pr.v, 1)) / ref.G
                    for i, pr in enumerate(pairs)])
    return out
