"""A pure-torch stand-in for flash-attn's `flash_attn_with_kvcache`, enforcing the library's documented checks.

Installed as the `flash_attn` module by the `flash_standin` fixture (tests/attention/test_gpu_contracts.py), so kvbench's
flash paths (static: kvbench.attention.flash; serve: kvbench.serve.paged_attention._flash) run on the CPU, and any
call the real kernel would refuse fails here too. The checks follow flash-attn 2.x's `mha_fwd_kvcache`
(csrc/flash_attn/flash_api.cpp) and its docstring (flash_attn/flash_attn_interface.py):

* q, k_cache, v_cache in float16 or bfloat16, all of one dtype; every tensor on one device;
* last dimension contiguous (`stride(-1) == 1`) for q, k_cache, v_cache;
* head_dim <= 256 and a multiple of 8; Hq divisible by H_kv;
* cache_seqlens: int32 of shape (B,) (or a Python int); block_table: int32, contiguous last dimension,
  (B, max_blocks), with a page (block) size that is a multiple of 256;
* causal attention is aligned bottom-right: query i of T sees cache slot j iff j <= seqlen_b - T + i;
  window_size (left, right) limits that to seqlen_b - T + i - left <= j <= seqlen_b - T + i + right
  (-1: unlimited); softcap > 0 caps the logits at softcap * tanh(s / softcap). A query that sees no key
  gets zeros (flash's convention for an empty row).
"""

from __future__ import annotations

import math
import types

import torch

CALLS: list[dict] = []  # one entry per call: what the kernel was asked (tests read it)


class FlashContractError(RuntimeError):
    """What the real kernel raises (a TORCH_CHECK) for an input it does not accept."""


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise FlashContractError(msg)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """q (B, T, Hq, D); k_cache/v_cache (B_c, S, H, D), or (num_blocks, page, H, D) with block_table (B, nb)."""
    _check(k is None and v is None and rotary_cos is None and cache_batch_idx is None and cache_leftpad is None
           and alibi_slopes is None, "stand-in: appending k/v, rotary, cache_batch_idx, leftpad, alibi not modelled")
    _check(q.dtype in (torch.float16, torch.bfloat16), f"FlashAttention only support fp16 and bf16 data type ({q.dtype})")
    _check(k_cache.dtype == q.dtype and v_cache.dtype == q.dtype, "query and key must have the same dtype")
    tensors = [x for x in (q, k_cache, v_cache, cache_seqlens, block_table) if isinstance(x, torch.Tensor)]
    _check(len({x.device for x in tensors}) == 1, f"all tensors must be on one device: {[x.device for x in tensors]}")
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check(x.stride(-1) == 1, f"{name} must have contiguous last dimension")
        _check(x.dim() == 4, f"{name} must be 4-D")
    B, T, Hq, D = q.shape
    H = k_cache.shape[2]
    _check(D <= 256, "FlashAttention forward only supports head dimension at most 256")
    _check(D % 8 == 0, "head dimension must be a multiple of 8")
    _check(Hq % H == 0, "Number of heads in key/value must divide number of heads in query")
    _check(k_cache.shape == v_cache.shape, "k_cache and v_cache must have the same shape")
    if block_table is not None:
        _check(block_table.dtype == torch.int32, "block_table must have dtype torch.int32")
        _check(block_table.stride(-1) == 1, "block_table must have contiguous last dimension")
        _check(block_table.dim() == 2 and block_table.shape[0] == B, "block_table must be (batch_size, max_blocks)")
        page = k_cache.shape[1]
        _check(page % 256 == 0, "Paged KV cache block size must be divisible by 256")
        keys = k_cache[block_table.long()].reshape(B, -1, H, D)  # (B, nb * page, H, D)
        values = v_cache[block_table.long()].reshape(B, -1, H, D)
    else:
        _check(k_cache.shape[0] == B, "k_cache's batch must be q's (cache_batch_idx not modelled)")
        keys, values = k_cache, v_cache
    S = keys.shape[1]
    if cache_seqlens is None:
        seqlens = torch.full((B,), S, dtype=torch.long, device=q.device)
    elif isinstance(cache_seqlens, int):
        seqlens = torch.full((B,), cache_seqlens, dtype=torch.long, device=q.device)
    else:
        _check(cache_seqlens.dtype == torch.int32, "cache_seqlens must have dtype int32")
        _check(tuple(cache_seqlens.shape) == (B,), f"cache_seqlens must have shape (batch_size,) = ({B},)")
        seqlens = cache_seqlens.long()
    CALLS.append({"q": tuple(q.shape), "paged": block_table is not None, "causal": causal, "window": window_size,
                  "softcap": softcap, "dtype": q.dtype})
    scale = softmax_scale if softmax_scale is not None else 1 / math.sqrt(D)
    G = Hq // H
    kf = keys.float().repeat_interleave(G, dim=2)  # (B, S, Hq, D)
    vf = values.float().repeat_interleave(G, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q.float(), kf) * scale  # (B, Hq, T, S)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    j = torch.arange(S, device=q.device)[None, None, :]  # (1, 1, S)
    i = torch.arange(T, device=q.device)[None, :, None]  # (1, T, 1)
    diag = seqlens[:, None, None] - T + i  # (B, T, 1) the slot query i is aligned with
    ok = j < seqlens[:, None, None]
    left, right = window_size
    if causal:
        right = 0
    if right >= 0:
        ok = ok & (j <= diag + right)
    if left >= 0:
        ok = ok & (j >= diag - left)
    s = s.masked_fill(~ok[:, None], float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # an empty row: zeros
    out = torch.einsum("bhts,bshd->bthd", p, vf).to(q.dtype)  # (B, T, Hq, D)
    return out


def module() -> types.ModuleType:
    """A `flash_attn` module holding the stand-in."""
    m = types.ModuleType("flash_attn")
    m.flash_attn_with_kvcache = flash_attn_with_kvcache
    m.__version__ = "2.stand-in"
    return m
