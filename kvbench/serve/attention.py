"""Attention over the paged pool, registered with transformers like kvbench's static attention.

`paged_attention` is registered under its own name (with a mask function returning None: the mask
comes from the forward's `Layout`) and is active only inside `paged(model)`, on that model. The
model runs with `use_cache=False`: each layer's new keys/values (post-RoPE) are written into the
pool here, then each request's slots are gathered (CPU; flash-attn's paged kernel with a
`block_table` on CUDA is a TODO: it needs a GPU to be tested) and one batched SDPA runs over all
requests with the layout's mask. Scored policies also get their attention statistics accumulated
into the pool (the same `attention_stats` as the static engine).
"""

from __future__ import annotations

import contextlib

import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from kvbench.attention import SCORE_CHUNK, attention_stats

NAME = "kvbench_paged"
_state = {"score_chunk": SCORE_CHUNK}


def paged_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """query (1, Hq, T, D), key/value (1, H_kv, T, D): the packed new tokens of every request."""
    pool, lay = kwargs["kvbench_pool"], kwargs["kvbench_layout"]
    layer = module.layer_idx
    K, V = pool.k[layer], pool.v[layer]  # (S, H, D)
    K[lay.write] = key[0].transpose(0, 1).to(K.dtype)  # (T, H, D)
    V[lay.write] = value[0].transpose(0, 1).to(V.dtype)
    k = K[lay.gather].transpose(1, 2)  # (R, H, Nmax, D)
    v = V[lay.gather].transpose(1, 2)
    q = query[0][:, lay.q_index].transpose(0, 1)  # (R, Hq, Kmax, D)
    out = F.scaled_dot_product_attention(
        q, k.to(q.dtype), v.to(q.dtype), attn_mask=lay.mask, scale=scaling, enable_gqa=q.shape[1] != k.shape[1]
    )  # (R, Hq, Kmax, D)
    if pool.track:
        w_sum, w_last = attention_stats(q, k.to(q.dtype), lay, scaling, _state["score_chunk"])  # (R, H, Nmax)
        sw, lw = pool.sum_w[layer], pool.last_w[layer]  # (S, H)
        sw[lay.write] = 0.0  # a new pair starts from nothing (its slot may hold a former owner's)
        idx = lay.gather[lay.key_valid]  # distinct slots: no block has two owners
        sw[idx] += w_sum.transpose(1, 2)[lay.key_valid]
        lw[idx] = w_last.transpose(1, 2)[lay.key_valid]
    return out.transpose(1, 2)[lay.real][None], None  # (1, T, Hq, D)


def _no_mask(*args, **kwargs):
    return None


def register() -> None:
    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, paged_attention)
        AttentionMaskInterface.register(NAME, _no_mask)


@contextlib.contextmanager
def paged(model, score_chunk: int = SCORE_CHUNK):
    """Run `model` with paged attention inside the block; restore its implementation after."""
    register()
    previous = model.config._attn_implementation
    _state["score_chunk"] = score_chunk
    model.set_attn_implementation(NAME)
    try:
        yield model
    finally:
        model.set_attn_implementation(previous or "sdpa")

