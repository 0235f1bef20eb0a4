"""The `sdpa` backend: torch's scaled_dot_product_attention over the cache's kept pairs.

It returns the output only; a policy that needs attention statistics gets them from the separate pass in
`kvbench.attention.pair_weights` (so the output kernel stays fused). On CUDA, grouped-query attention with a mask
has no fused kernel, so K/V are expanded per query head here (what kvbench.memory charges for it).
"""

from __future__ import annotations

import torch.nn.functional as F

from kvbench.attention.masks import query_heads, repeat_kv

EXPAND_GQA_DEVICES = {"cuda"}  # device types whose SDPA has no fused kernel for GQA with a mask (tests may add cpu)


def sdpa_attention(query, key, value, step, scaling):
    """SDPA over the kept pairs: query (B, Hq, T, D), key/value (B, H_kv, N, D); returns (B, Hq, T, D).

    On CUDA, grouped-query attention with a mask has no fused kernel (flash takes no mask, the
    memory-efficient one no GQA): SDPA would fall back to its math kernel, which copies K/V per query head
    AND materialises the (B, Hq, T, N) probabilities. K/V are expanded here instead (2·B·Hq·N·D·e, what
    kvbench.memory charges), so the memory-efficient kernel runs with the mask."""
    gqa = query.shape[1] != key.shape[1]
    mask = query_heads(step.mask, query.shape[1])  # (B or 1, 1 or Hq, T, N) or None
    if gqa and mask is not None and query.device.type in EXPAND_GQA_DEVICES:
        groups = query.shape[1] // key.shape[1]
        key, value, gqa = repeat_kv(key, groups), repeat_kv(value, groups), False  # (B, Hq, N, D)
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, is_causal=step.causal, scale=scaling, enable_gqa=gqa,
    )  # (B, Hq, T, D)
