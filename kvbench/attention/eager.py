"""The `eager` backend: the paper's conditions, transformers' `eager_attention_forward` on kvbench's cache.

The (B, Hq, T, N) logits in the model dtype, masked, softmax upcast to float32 and cast back, times V, GQA by
repeating K and V; one layer at a time and no query chunking, so the memory and speed are those of a 2024
Hugging Face implementation. The statistics come from those same probabilities (no second pass). Gemma 2's
soft-capping and gpt-oss's sinks follow those models' own eager functions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvbench.attention.masks import keep_mask, query_heads, repeat_kv
from kvbench.attention.pair_weights import stats_from_probs


def eager_attention(query, key, value, step, scaling, track: bool, sinks=None, softcap=None):
    """transformers' `eager_attention_forward` (models/llama/modeling_llama.py, 5.x) on kvbench's cache.

    query (B, Hq, T, D), key/value (B, H_kv, N, D). Returns the output (B, T, Hq, D) and, when `track`,
    the statistics from the very probabilities the output was computed with. Transient (per element
    of (B, Hq, T, N), e = model dtype bytes): the logits and their scaled copy (2e), the masked copy
    while the scaled one is alive (2e), softmax in float32 (+4 for its float32 copy of the input
    unless e = 4, +4 output), the cast back (e, the float32 weights still alive); plus repeat_kv's
    copies of K and V, 2 * B * Hq * N * D * e when Hq > H_kv.
    """
    B, Hq, T, _ = query.shape
    H, N = key.shape[1], key.shape[2]
    key_states = repeat_kv(key, Hq // H)  # (B, Hq, N, D)
    value_states = repeat_kv(value, Hq // H)
    w = torch.matmul(query, key_states.transpose(2, 3)) * scaling  # (B, Hq, T, N) model dtype
    if softcap is not None:  # Gemma 2's eager_attention_forward
        w = torch.tanh(w / softcap) * softcap
    keep = query_heads(keep_mask(step, T, N, query.device), Hq)  # (B or 1, 1 or Hq, T, N) or None
    if keep is not None:  # transformers adds a (B, 1, T, N) mask of 0 / dtype-min: the same values
        w = torch.where(keep, w, torch.finfo(w.dtype).min)
    if sinks is not None:  # gpt-oss's eager_attention_forward: the sink as one more logit, softmax in the model dtype
        w = torch.cat([w, sinks.reshape(1, -1, 1, 1).expand(B, -1, T, 1).to(w.dtype)], dim=-1)  # (B, Hq, T, N + 1)
        w = w - w.max(dim=-1, keepdim=True).values
        w = F.softmax(w, dim=-1, dtype=w.dtype)[..., :N].to(query.dtype)
    else:
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)  # (B, Hq, T, N)
    out = torch.matmul(w, value_states)  # (B, Hq, T, D)
    del key_states, value_states
    stats = stats_from_probs(w, step, H) if track else None
    del w
    return out.transpose(1, 2).contiguous(), stats
