"""Attention over the paged pool, registered with transformers like kvbench's static attention.

`paged_attention` is registered under its own name (with a mask function returning None: what each query
sees comes from the forward's `Layout`) and is active only inside `paged(model)`, on that model. The model
runs with `use_cache=False` on the packed tokens of every scheduled request: each layer's new keys/values
(RoPE applied) are written into the pool here, then each `Part` of the layout (a prefill chunk, or a group
of decode rows of similar length) attends over its own pages:

* CPU, or CUDA without flash-attn: the part's pages are gathered block by block and one SDPA call runs
  over them (`sdpa`); scored policies instead get the output and their statistics from ONE set of
  probabilities (kvbench.attention's `fused` path: no second QK^T pass);
* CUDA with flash-attn installed, a policy that needs no statistics and a block size that is a multiple of
  256 (flash-attn's paged-KV constraint): `flash_attn_with_kvcache` reads the pages in place through the
  block table. This path has not run on a GPU yet (no GPU has been lent to this project's serving work);
  `PAGED_FLASH` says whether it may be used.

The record's `attention` names what ran: `paged_sdpa`, `paged_fused` (scored policies), `paged_flash`.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from kvbench import attention as _attention
from kvbench.attention import SCORE_CHUNK, _fused

NAME = "kvbench_paged"
FLASH_BLOCK = 256  # flash-attn's paged KV needs a page size that is a multiple of this
_state = {"score_chunk": SCORE_CHUNK}


def backend(device: torch.device, dtype: torch.dtype, track: bool, block_size: int) -> str:
    """What a serve run's attention is: paged_flash, paged_fused (statistics) or paged_sdpa."""
    if track:
        return "paged_fused"
    half = dtype in (torch.float16, torch.bfloat16)
    if half and _attention.flash_available(device) and block_size % FLASH_BLOCK == 0:
        return "paged_flash"
    return "paged_sdpa"


def _flash(q, kb, vb, part, scaling):
    """flash-attn's paged kernel: q (R_p, Hq, K_q, D); kb/vb (num_blocks, block_size, H, D), read in place."""
    from flash_attn import flash_attn_with_kvcache  # the optional `flash` extra

    return flash_attn_with_kvcache(q.transpose(1, 2), kb, vb, cache_seqlens=part.n_after, block_table=part.table,
                                   softmax_scale=scaling, causal=True)  # (R_p, K_q, Hq, D): bottom-right aligned


def paged_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """query (1, Hq, T, D), key/value (1, H_kv, T, D): the packed new tokens of every request."""
    pool, lay = kwargs["kvbench_pool"], kwargs["kvbench_layout"]
    layer = module.layer_idx
    K, V = pool.k[layer], pool.v[layer]  # (S, H, D)
    K[lay.write] = key[0].transpose(0, 1).to(K.dtype)  # (T, H, D)
    V[lay.write] = value[0].transpose(0, 1).to(V.dtype)
    if pool.k_src is not None:  # re-rotation's source: the keys as written
        pool.k_src[layer][lay.write] = K[lay.write]
    S, H, D = K.shape
    bs = pool.block_size
    kb, vb = K.view(S // bs, bs, H, D), V.view(S // bs, bs, H, D)
    q = query[0].transpose(0, 1)  # (T, Hq, D)
    out = torch.empty(q.shape, dtype=query.dtype, device=query.device)
    kind = lay.attention
    if pool.track:
        sw, lw = pool.sum_w[layer], pool.last_w[layer]  # (S, H)
        sw[lay.write] = 0.0  # a new pair starts from nothing (its slot may hold a former owner's)
    for part in lay.parts:
        qp = q[part.q_index].transpose(1, 2)  # (R_p, Hq, K_q, D)
        if kind == "paged_flash":
            out[part.out] = _flash(qp, kb, vb, part, scaling)[part.real]
            continue
        R, N = part.rows, part.slots.shape[1]
        if part.fresh is not None:  # a first chunk attends to its own new keys: no gather
            k, v = key[:, :, part.fresh], value[:, :, part.fresh]  # (1, H, k, D)
        else:
            k = kb.index_select(0, part.blocks).view(R, N, H, D).transpose(1, 2)  # (R_p, H, N, D): whole pages
            v = vb.index_select(0, part.blocks).view(R, N, H, D).transpose(1, 2)
        if kind == "paged_fused":  # output and statistics from one set of probabilities
            o, (w_sum, w_last) = _fused(qp, k.to(qp.dtype), v.to(qp.dtype), part, scaling, _state["score_chunk"])
            valid = part.key_valid[:, : w_sum.shape[-1]]  # a first chunk's N is its own length
            idx = part.slots[:, : w_sum.shape[-1]][valid]  # distinct slots: no block has two owners
            sw[idx] += w_sum.transpose(1, 2)[valid]
            lw[idx] = w_last.transpose(1, 2)[valid]
        else:
            o = F.scaled_dot_product_attention(qp, k.to(qp.dtype), v.to(qp.dtype), attn_mask=part.additive(qp.dtype), scale=scaling,
                                               is_causal=part.causal, enable_gqa=qp.shape[1] != H
                                               ).transpose(1, 2)  # (R_p, K_q, Hq, D)
        out[part.out] = o[part.real]
    return out[None], None  # (1, T, Hq, D)


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
