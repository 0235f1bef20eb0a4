"""What each query may see and which K/V heads it reads: the two helpers every kernel shares.

`keep_mask` turns the cache's step (its band/causal mask, built once per forward by `KVCache.begin_forward`)
into a boolean (B or 1, 1, T, N) mask, or None when every query sees every key (under adaptive head budgets the
cache's mask is per KV head, (B, H_kv, T, N): `query_heads` repeats it for the query heads of each group where a
kernel needs one mask row per query head); `repeat_kv` is transformers' GQA expansion, used where a kernel needs
one K/V head per query head (eager, and SDPA on CUDA with a mask).
"""

from __future__ import annotations

import torch


def keep_mask(step, T: int, N: int, device) -> torch.Tensor | None:
    """(B or 1, 1, T, N) bool: which keys each query may see; None when it sees all of them."""
    if step.mask is not None:
        return step.mask
    if step.causal:  # a first block of T == N real tokens per sample
        return torch.ones(T, N, dtype=torch.bool, device=device).tril_(N - T)[None, None]  # one (T, N) tensor
    return None


def query_heads(mask: torch.Tensor | None, q_heads: int) -> torch.Tensor | None:
    """A mask per KV head (B, H_kv, T, N) repeated for the query heads of each group: (B, H_q, T, N); a mask
    shared by the heads (B or 1, 1, T, N), or None, as it is."""
    if mask is None or mask.shape[1] in (1, q_heads):
        return mask
    return mask.repeat_interleave(q_heads // mask.shape[1], dim=1)


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """transformers' repeat_kv: (B, H_kv, N, D) -> (B, H_kv * groups, N, D), a copy when groups > 1."""
    if groups == 1:
        return x
    B, H, N, D = x.shape
    return x[:, :, None].expand(B, H, groups, N, D).reshape(B, H * groups, N, D)
