"""The `fused` backend: output and attention statistics from ONE set of probabilities per chunk of queries.

Scored policies need the attention weights each cached pair received; SDPA and flash do not return them, so
those backends pay a second QK^T pass (`kvbench.attention.pair_weights`). Here the probabilities of a chunk of
`chunk` queries are computed once and used for both the output and the statistics. It is also the path for
layers SDPA cannot run: learned sinks (gpt-oss) and soft-capped logits (Gemma 2). Serve mode's paged
attention reuses it on each part of its pool.
"""

from __future__ import annotations

import torch

from kvbench.attention.masks import keep_mask


def fused_attention(query, key, value, step, scaling, chunk: int, track: bool = True, sinks=None, softcap=None):
    """Output and statistics from one set of probabilities per chunk of `chunk` queries (no second pass).

    Like `attention_stats`, the G query heads of a KV group and the chunk's queries are folded into
    one (B, H_kv, G * tc, D) matrix (no copy of K or V per query head); logits in the model dtype,
    masked in place, softmax in float32 (float64 for float64 models), cast to the model dtype for the
    product with V. query (B, Hq, T, D), key/value (B, H_kv, N, D). Returns the output (B, T, Hq, D) and
    (w_sum, w_last), both (B, H_kv, N) float32 (None unless `track`).
    `softcap`: tanh(logits / c) * c before the mask (Gemma 2); `sinks` (Hq,): one more logit per query head in
    every softmax, dropped after it (gpt-oss): its mass stays in the denominator of the weights and statistics.
    """
    B, Hq, T, D = query.shape
    H, N = key.shape[1], key.shape[2]
    G = Hq // H
    acc = torch.promote_types(query.dtype, torch.float32)
    kt = key.transpose(-1, -2)  # (B, H, D, N), a view
    out = torch.empty(B, T, Hq, D, dtype=query.dtype, device=query.device)  # what the layer wants
    keep = keep_mask(step, T, N, query.device)  # (B or 1, 1 or H_kv, T, N) or None: broadcast over each group
    w_sum = torch.zeros(B, H, N, dtype=acc, device=query.device) if track else None
    w_last = None
    sink = None if sinks is None else sinks.to(acc).view(1, H, G, 1, 1)
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        tc = t1 - t0
        q = (query[:, :, t0:t1] * scaling).reshape(B, H, G * tc, D)  # (B, H, G*tc, D), heads of a group adjacent
        s = torch.matmul(q, kt)  # (B, H, G*tc, N) model dtype
        del q
        if s.dtype != acc:
            s = s.to(acc)
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        if keep is not None:
            s.view(B, H, G, tc, N).masked_fill_(~keep[:, :, None, t0:t1], float("-inf"))
        if sink is None:
            p = torch.softmax(s, dim=-1)  # slot 0 is never masked, so no row is empty
        else:  # (B, H, G*tc, N + 1): the sink's logit last, dropped after the softmax
            s = torch.cat([s, sink.expand(B, H, G, tc, 1).reshape(B, H, G * tc, 1)], dim=-1)
            p = torch.softmax(s, dim=-1)[..., :N]
        del s
        pv = p if p.dtype == value.dtype else p.to(value.dtype)
        o = torch.matmul(pv, value)  # (B, H, G*tc, D)
        del pv
        out[:, t0:t1] = o.view(B, Hq, tc, D).transpose(1, 2)
        del o
        if not track:
            del p
            continue
        p5 = p.reshape(B, H, G, tc, N)
        if t1 == T and T > 1:
            w_last = p5[:, :, :, -1].mean(dim=2)  # (B, H, N): the newest query's row, group mean
        if not step.all_real:
            p5.masked_fill_(~step.real[:, None, None, t0:t1, None], 0.0)  # pad queries give no weight
        w_sum += p5.sum(dim=3).mean(dim=2)
        del p, p5
    if not track:
        return out, None
    if w_last is None:  # one query: its row is the sum
        w_last = w_sum
    return out, (w_sum.float(), w_last.float())
