"""Attention statistics: the weight each cached pair received in a forward, what scored policies rank by.

`attention_stats` is the separate pass the `sdpa` and `flash` backends need (their kernels return no
weights): the weights are recomputed in chunks of queries, so the extra memory is O(B * H * chunk * N) and
the output kernel stays fused. `stats_from_probs` reads them off probabilities a backend already has (eager).
Both return (w_sum, w_last), each (B, H_kv, N) float32, which the cache accumulates per layer.
"""

from __future__ import annotations

import torch


def attention_stats(query, key, step, scaling: float, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention weights each cached pair received in this forward.

    query (B, Hq, T, D), key (B, H_kv, N, D). Returns (w_sum, w_last), both (B, H_kv, N) float32:
    w_sum sums the softmax rows of the real queries; w_last is the newest query's row. Query heads
    of a GQA group are averaged.

    Vectorised over batch, heads and the queries of a chunk, with one score buffer per chunk:
    the G query heads of a KV group and the chunk's queries are folded into one matrix, so a single
    batched matmul against the group's keys (no broadcast copy of the keys per query head) gives the
    (B, H_kv, G * tc, N) logits; masking runs in place on that buffer, then one fused softmax.
    Logits are computed in the model's dtype like eager attention, the softmax in float32. Peak extra
    memory per chunk, per (B, Hq, tc, N) element: 8 bytes for float32, float16 and bfloat16 models
    (float32 logits + weights; a half-precision matmul output is dropped once converted), 12 for
    float64 (its logits, their float32 copy, the weights), + O(B * Hq * chunk * D).
    """
    B, Hq, T, D = query.shape
    H, N = key.shape[1], key.shape[2]
    G = Hq // H
    acc = torch.float32  # softmax and sums; the statistics are stored in float32 anyway
    kt = key.transpose(-1, -2)  # (B, H, D, N), a view
    w_sum = torch.zeros(B, H, N, dtype=acc, device=query.device) if T > chunk else None
    w_last = None
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        tc = t1 - t0
        q = (query[:, :, t0:t1] * scaling).reshape(B, H, G * tc, D)  # (B, H, G*tc, D), heads of a group adjacent
        s = torch.matmul(q, kt)  # (B, H, G*tc, N)
        if s.dtype != acc:
            s = s.to(acc)
        s4 = s.view(B, H, G, tc, N)
        if step.mask is not None:
            s4.masked_fill_(~step.mask[:, :, None, t0:t1], float("-inf"))  # mask (B, 1 or H_kv, T, N)
        elif step.causal:
            qpos = torch.arange(t0, t1, device=query.device)[:, None]
            s4.masked_fill_(torch.arange(N, device=query.device)[None, :] > qpos, float("-inf"))
        s = torch.softmax(s, dim=-1)  # one fused kernel; slot 0 is never masked, so no row is empty
        s4 = s.view(B, H, G, tc, N)
        if t1 == T and T > 1:
            w_last = s4[:, :, :, -1].mean(dim=2)  # (B, H, N): the newest query's row, group mean
        if not step.all_real:
            s4.masked_fill_(~step.real[:, None, None, t0:t1, None], 0.0)  # pad queries give no weight
        if w_sum is None:  # a single chunk (always so while decoding)
            w_sum = s.sum(dim=2)  # (B, H, N)
        else:
            w_sum += s.sum(dim=2)
        del s, s4  # the next chunk's logits must not coexist with these weights
    if G > 1:
        w_sum /= G
    if w_last is None:  # one query: its row is the sum (for samples without a query, w_last is unused)
        w_last = w_sum
    return w_sum.float(), w_last.float()


def stats_from_probs(p: torch.Tensor, step, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_sum, w_last), both (B, H_kv, N) float32, from probabilities p (B, Hq, T, N) (pad rows zeroed in place).

    p may be a (B, H_kv, G * T, N) folded view too: it is read as (B, H_kv, G, T, N).
    """
    B, N = p.shape[0], p.shape[-1]
    T = step.real.shape[1]
    p5 = p.reshape(B, kv_heads, -1, T, N)  # (B, H, G, T, N), a view
    if not step.all_real:  # pad queries give no weight (their outputs are discarded anyway)
        p5.masked_fill_(~step.real[:, None, None, :, None], 0.0)
    acc = torch.promote_types(p.dtype, torch.float32)
    w_sum = p5.sum(dim=3, dtype=acc).mean(dim=2)  # (B, H, N)
    w_last = p5[:, :, :, -1].mean(dim=2, dtype=acc) if T > 1 else w_sum  # the newest query's row
    return w_sum.float(), w_last.float()
