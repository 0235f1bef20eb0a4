"""kvbench's attention function and the context that activates it on one model.

`kvbench_attention` is registered with transformers' `AttentionInterface` (and a mask function
returning None under the same name: the mask is built from the cache, once per forward, by
`KVCache.begin_forward`). It is active only inside `kv_attention(model)`, on that model, never
globally: outside the context the model runs its own implementation.

The output comes from SDPA (or flash-attn's kv-cache kernel on CUDA in half precision when the
`flash` extra is installed: `gen.attention=auto|sdpa|flash`);
when the policy needs attention statistics, the weights are recomputed separately, in chunks of
queries, so the extra memory is O(B * H * chunk * N) and the output kernel stays fused.
"""

from __future__ import annotations

import contextlib
import importlib.util

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface

NAME = "kvbench"
SCORE_CHUNK = 64  # queries per chunk when computing attention weights for scores
BACKENDS = ("auto", "sdpa", "flash")
FLASH_CHECK_TOL = 2e-2  # max |flash - SDPA| accepted on the first flash call of a process
_state = {"score_chunk": SCORE_CHUNK, "backend": "sdpa", "flash_checked": False}


def flash_available() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


def resolve_backend(backend: str, model) -> str:
    """auto: flash-attn when installed, on CUDA, in half precision; else SDPA."""
    if backend == "auto":
        half = model.dtype in (torch.float16, torch.bfloat16)
        return "flash" if flash_available() and half and model.device.type == "cuda" else "sdpa"
    return backend


def _sdpa(query, key, value, step, scaling):
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=step.mask, is_causal=step.causal, scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )  # (B, Hq, T, D)


def _flash(query, key, value, step, scaling):
    """flash-attn's kv-cache kernel on the cache's own storage (no copy).

    With causal=True it aligns each sample's mask bottom-right on its own `cache_seqlens`: query i
    sees slots <= n_b - T + i, which is exactly kvbench's mask since real queries are right-aligned
    in the chunk (pad rows may see nothing; flash returns zeros for them, they are discarded).
    The first call of a process is checked against SDPA (this path had no GPU to be tested on).
    """
    from flash_attn import flash_attn_with_kvcache  # the optional `flash` extra

    out = flash_attn_with_kvcache(
        query.transpose(1, 2),  # (B, T, Hq, D)
        key.transpose(1, 2),  # (B, N, H_kv, D), a strided view of the cache
        value.transpose(1, 2),
        cache_seqlens=step.seqlens,
        softmax_scale=scaling,
        causal=True,
    ).transpose(1, 2)  # (B, Hq, T, D)
    if not _state["flash_checked"]:
        ref = _sdpa(query, key, value, step, scaling)
        real = step.real[:, None, :, None]  # compare real queries only
        err = ((out - ref).abs() * real).max().item()
        if not err <= FLASH_CHECK_TOL:
            raise RuntimeError(f"flash-attn disagrees with SDPA on kvbench's cache (max |diff| {err:.3g}); use gen.attention=sdpa")
        _state["flash_checked"] = True
    return out


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
            s4.masked_fill_(~step.mask[:, :, None, t0:t1], float("-inf"))  # mask (B, 1, T, N)
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


def kvbench_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """AttentionInterface entry: query (B, Hq, T, D), key/value (B, H_kv, N, D) = the cache's kept pairs."""
    cache = kwargs.get("kvbench_cache")
    if cache is None:  # called outside kvbench's engine: behave like SDPA
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    step = cache.step_on(query.device)
    out = (_flash if _state["backend"] == "flash" else _sdpa)(query, key, value, step, scaling)  # (B, Hq, T, D)
    if cache.query_window:  # a policy scoring with the newest queries (SnapKV's observation window)
        cache.remember_queries(module.layer_idx, query, scaling)
    if cache.track_attention:
        w_sum, w_last = attention_stats(query, key, step, scaling, _state["score_chunk"])
        cache.accumulate(module.layer_idx, w_sum, w_last)
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*args, **kwargs):
    return None  # kvbench_attention builds its own mask from the cache


def register() -> None:
    """Make the name "kvbench" known to transformers (idempotent; changes no model)."""
    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, kvbench_attention)
        AttentionMaskInterface.register(NAME, _no_mask)


@contextlib.contextmanager
def kv_attention(model, score_chunk: int = SCORE_CHUNK, backend: str = "auto"):
    """Run `model` with kvbench's attention inside the block; restore its implementation after."""
    register()
    previous = model.config._attn_implementation
    _state["score_chunk"] = score_chunk
    _state["backend"] = resolve_backend(backend, model)
    model.set_attn_implementation(NAME)
    try:
        yield model
    finally:
        model.set_attn_implementation(previous or "sdpa")
