"""RoPE re-rotation (`policy.rerotate=true`): a kept pair's rotary position is its slot, always.

After an eviction compacts the kept pairs to slots [0, keep), each kept key is set to its key *as written*
(`k_src`, rotated by the model at its write slot `rot`) rotated by (new slot - rot), in float32 (float64
for float64 keys) and rounded once: a key is never rotated again from an already rounded rotation, so in
half precision the error does not compound over evictions (rotating the cached key itself lost 7.6% in
bfloat16 after 64 evictions, 58% after 512; tests/cache/test_rotate_half.py). New tokens are rotated at their
slots, i.e. continue from the kept count. A SnapKV window's kept queries follow the newest pairs.
"""

from __future__ import annotations

import torch
from transformers.models.llama.modeling_llama import rotate_half


def rotate(k: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Keys k (..., D) with RoPE at position p, rotated by `delta` (...,) to position p + delta.

    RoPE is a rotation per pair of dimensions (i, i + R/2) by angle p * inv_freq[i] (inv_freq (R/2,)), and
    rotations compose: R(p + delta) = R(delta) R(p). Dimensions past R (partial rotary) are left alone.
    """
    inv = inv_freq.to(k.device, non_blocking=True)  # host to device without waiting for queued kernels
    R = 2 * inv.shape[0]
    acc = torch.promote_types(k.dtype, torch.float32)
    freqs = delta[..., None].to(acc) * inv.to(acc)  # (..., R/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    del freqs
    cos, sin = emb.cos(), emb.sin()
    del emb
    kr = k[..., :R].to(acc)
    rotated = rotate_half(kr)  # transformers' own; before `kr * cos`, so its temporaries never coexist with it
    out = (kr * cos).addcmul_(rotated, sin).to(k.dtype)
    return out if R == k.shape[-1] else torch.cat((out, k[..., R:]), dim=-1)


def from_written(g, layers: slice, sel, K: int, inv_freq: torch.Tensor) -> None:
    """Set the group's kept keys (slots [0, K) of `layers`, rows `sel`) from their written copies, already
    compacted with `rot`: each rotated from the slot it was written at to the slot it holds now."""
    src = g.k_src[layers, sel, :, :K]  # (l, B', H, K, D) (a copy when sel indexes rows)
    delta = torch.arange(K, device=g.device) - g.rot[layers, sel, :, :K]  # written slot -> new slot
    g.k[layers, sel, :, :K] = rotate(src, delta, inv_freq)


def queries_follow(g, sel, shift: torch.Tensor, inv_freq: torch.Tensor) -> None:
    """Rotate the kept window queries of rows `sel` by `shift` (1, B', 1, 1): the slot shift of the newest pairs."""
    g.q[:, sel] = rotate(g.q[:, sel], shift.expand(-1, -1, g.q.shape[2], g.q.shape[3]), inv_freq)
