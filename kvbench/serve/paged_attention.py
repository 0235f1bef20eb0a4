"""Attention over the paged pool: serve mode's attention step (`PagedStep`), the object kvbench's registered
attention function hands each layer to (kvbench.attention.interface), as the static engine's `StaticStep`.

The model runs with `use_cache=False` on the packed tokens of every scheduled request, inside
`kvbench.attention.kv_attention(model)`, with the forward's `PagedStep` as the keyword `kvbench_step`: each
layer's new keys/values (RoPE applied) are written into their pages here (each (layer, KV head) its own), then
each `Part` of the layout (a prefill chunk, or a group of decode rows of similar length) attends over its own
pages:

* CPU, or CUDA without flash-attn: the part's pages are gathered (one index per page) and one SDPA call
  runs over them (`sdpa`); when the heads of a row hold different counts the G query heads of a KV group
  are folded into the query axis so each KV head gets its own mask. Scored policies instead get the
  output and their statistics from ONE set of probabilities (kvbench.attention's `fused` path: no second
  QK^T pass);
* CUDA with flash-attn installed, a policy that needs no statistics and a block size that is a multiple of
  256 (flash-attn's paged-KV constraint, `FLASH_BLOCK`): `flash_attn_with_kvcache` reads the pages in place,
  each (row, KV head) a sequence of its own (`backend` decides; tests/flash_standin.py runs it on the CPU).

The record's `attention` names what ran: `paged_sdpa`, `paged_fused` (scored policies), `paged_flash`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kvbench.attention import SCORE_CHUNK, flash_available
from kvbench.attention.fused import fused_attention

FLASH_BLOCK = 256  # flash-attn's paged KV needs a page size that is a multiple of this


def backend(device: torch.device, dtype: torch.dtype, track: bool, block_size: int, quantized: bool = False) -> str:
    """What a serve run's attention is: paged_flash (never over quantized pages), paged_fused (statistics) or
    paged_sdpa."""
    if track:
        return "paged_fused"
    half = dtype in (torch.float16, torch.bfloat16)
    if half and not quantized and flash_available(device) and block_size % FLASH_BLOCK == 0:
        return "paged_flash"
    return "paged_sdpa"


def _flash(q, kp, vp, part, layer, scaling):
    """flash-attn's paged kernel, each (row, KV head) a sequence: q (R, Hq, K_q, D); kp/vp (P, bs, D) in place."""
    from flash_attn import flash_attn_with_kvcache  # the optional `flash` extra

    R, Hq, Kq, D = q.shape
    H = part.blocks.shape[2]
    qs = q.view(R, H, Hq // H, Kq, D).permute(0, 1, 3, 2, 4).reshape(R * H, Kq, Hq // H, D)
    o = flash_attn_with_kvcache(qs, kp[:, :, None], vp[:, :, None], cache_seqlens=part.n_after[layer].flatten().int(),
                                block_table=part.blocks[layer].flatten(0, 1).int(), softmax_scale=scaling, causal=True)
    return o.view(R, H, Kq, Hq // H, D).permute(0, 2, 1, 3, 4).reshape(R, Kq, Hq, D)  # bottom-right aligned


def _sdpa(qp, k, v, part, view, scaling):
    """qp (R, Hq, K_q, D), k/v (R, H, N, D) -> (R, K_q, Hq, D)."""
    R, Hq, Kq, D = qp.shape
    H = k.shape[1]
    if view.mask is None or view.mask.shape[1] == 1:  # one mask for every head
        return F.scaled_dot_product_attention(qp, k, v, attn_mask=part.additive(view, qp.dtype), scale=scaling,
                                              is_causal=view.causal, enable_gqa=Hq != H).transpose(1, 2)
    G = Hq // H  # each KV head its own mask: its G query heads folded into the query axis
    mask = view.mask[:, :, None].expand(R, H, G, Kq, view.mask.shape[-1]).reshape(R, H, G * Kq, -1)
    o = F.scaled_dot_product_attention(qp.reshape(R, H, G * Kq, D), k, v, attn_mask=mask, scale=scaling)
    return o.view(R, Hq, Kq, D).transpose(1, 2)


@dataclass
class PagedStep:
    """One forward over the paged pool: the pool, the forward's layout, the backend (`backend()`) and the query
    chunk of the statistics; `windows`: the requests' query windows to update (kvbench.serve.queries), or None."""

    pool: object
    layout: object  # kvbench.serve.page_layout.Layout
    attention: str = "paged_sdpa"
    score_chunk: int = SCORE_CHUNK
    windows: object = None
    observers: object = None  # a policy's observe step (kvbench.serve.observe), or None
    hidden_states: dict = field(default_factory=dict)  # layer -> its input hidden states (1, T, h), when declared

    def hidden(self, layer: int, states: torch.Tensor) -> None:
        self.hidden_states[layer] = states

    def attend(self, module, query, key, value, scaling, kwargs) -> torch.Tensor:
        """query (1, Hq, T, D), key/value (1, H_kv, T, D): the packed new tokens of every request."""
        out = paged_attention(self, module.layer_idx, query, key, value, scaling)
        if self.observers is not None:
            w = self.layout.write[module.layer_idx]
            key, value = self.pool.as_held(w, key, value)  # the new pairs as the pool holds them
            self.observers.observe(self.pool, w, module.layer_idx, module, query, key, value, scaling,
                                   self.hidden_states.pop(module.layer_idx, None))
        return out


def paged_attention(st: PagedStep, layer: int, query, key, value, scaling) -> torch.Tensor:
    """Write the layer's new pairs into their pages, then attend part by part; returns (1, T, Hq, D)."""
    pool, lay = st.pool, st.layout
    w = lay.write[layer]  # (T, H)
    pool.write_pairs(layer, w, key, value)  # a quantized pool (kvbench.serve.qpool) quantizes what left its window
    if st.windows is not None:
        st.windows.update(layer, query, scaling)
    q = query[0].transpose(0, 1)  # (T, Hq, D)
    out = torch.empty(q.shape, dtype=query.dtype, device=query.device)
    kind = st.attention
    if pool.track:
        pool.sum_w[w] = 0.0  # a new pair starts from nothing (its slot may hold a former owner's)
    for part in lay.parts:
        qp = q[part.q_index].transpose(1, 2)  # (R_p, Hq, K_q, D)
        if kind == "paged_flash":
            D, bs = pool.head_dim, pool.block_size
            kp, vp = pool.k.view(-1, bs, D), pool.v.view(-1, bs, D)  # (P, bs, D)
            out[part.out] = _flash(qp, kp, vp, part, layer, scaling)[part.real]
            continue
        if part.fresh is not None:  # a first chunk attends to its own new keys
            k, v = pool.fresh_pairs(part, layer, key, value)  # (1, H, k, D)
        else:
            k, v = pool.part_pairs(part, layer)  # (R, H, N, D): whole pages
        view = part.at(layer)
        if kind == "paged_fused":  # output and statistics from one set of probabilities
            o, (w_sum, w_last) = fused_attention(qp, k.to(qp.dtype), v.to(qp.dtype), view, scaling, st.score_chunk)
            slots, valid = part.slots(layer)
            n = w_sum.shape[-1]  # a first chunk's N is its own length
            idx = slots[..., :n][valid[..., :n]]  # distinct slots: no page has two owners
            pool.sum_w[idx] += w_sum[valid[..., :n]]
            pool.last_w[idx] = w_last[valid[..., :n]]
        else:
            o = _sdpa(qp, k.to(qp.dtype), v.to(qp.dtype), part, view, scaling)
        out[part.out] = o[part.real]
    return out[None]  # (1, T, Hq, D)
