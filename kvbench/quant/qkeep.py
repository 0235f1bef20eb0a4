"""Eviction from a quantized store: each (row, head) keeps a subset of its slots, laid out again by the same
rule as an append (its oldest q(k) quantized in whole blocks, the rest in the window: kvbench.quant.qsplit).

Values are quantized per token, so a kept value keeps its codes, scale and zero point exactly (a gather); a
window value that lands in a quantized block is quantized then, once.

Keys are quantized per channel over a block of G tokens, and the kept tokens of a (row, head) come from
different blocks: the new block's tokens share no scale. kvbench re-quantizes on compaction: the kept keys are
read (dequantized), gathered, and each new block quantized again per channel, except a block whose G slots are
an old quantized block's, unchanged: it keeps its codes and metadata (re-quantizing its read would not always
give them back: its scale, recomputed from the read max, can move by a rounding, and a code with it). So only
blocks whose tokens changed take a second rounding, and compaction frees the evicted pairs' memory at once. The alternatives: holes (evicted tokens masked in their
block, memory freed only when a whole block goes) free nothing until then, and eviction is there to free;
per-token keys avoid the question but lose KIVI's point (outlier channels: kvbench.quant.kivi's tests).

Measured (tests/quant/test_qstore.py `compaction_error`: normal keys with an outlier channel, G = R = 32, each
round keeping a random 3/4 of every (row, head)'s pairs then appending as many; random choice mixes blocks
most, the worst case): the RMS error of the held quantized keys against their original values is 1.26x a single
quantization's after one compaction, 1.42x after two, 1.73x after eight (4 and 8 bits, float32; 1.73-1.77x in
bfloat16): it grows with every re-quantization a key goes through, more slowly each time.
"""

from __future__ import annotations

import torch

from kvbench.quant.qsplit import quantized_count
from kvbench.quant.qtake import take


def keep(store, rows: torch.Tensor, kept: torch.Tensor, keep: torch.Tensor) -> None:
    """Rows (B,) bool of `store` keep the logical slots `kept` (L, B', H, K) in position order, `keep` (B,) each."""
    G, R, dev = store.group, store.residual, store.device
    sel = rows.nonzero()[:, 0].to(dev)
    k_new = keep[rows].to(torch.long).cpu()
    if bool((k_new > store.n[rows]).any()):
        raise RuntimeError("keep: a row cannot keep more pairs than it holds")
    q_old = quantized_count(store.n[rows], G, R).to(dev)  # (B',)
    q_new = quantized_count(k_new, G, R)
    Q, K = int(q_new.max()), kept.shape[-1]
    cr = store.rk.shape[3]
    back = (q_new[:, None] + torch.arange(cr)[None, :]).clamp(max=K - 1).to(dev)  # (B', C_r) window sources
    kept = kept.to(dev)
    for i in range(kept.shape[0]):
        idx = kept[i]  # (B', H, K)
        k, v = store.read(i, rows)  # (B', H, N, D) dequantized
        k, v = take(k, idx), take(v, idx)  # (B', H, K, D) the kept pairs in order
        if Q:
            _keys(store, i, sel, k[:, :, :Q], idx[..., :Q], q_old)
            _values(store, i, sel, v[:, :, :Q], idx[..., :Q], q_old)
        if cr:
            store.rk[i, sel] = take(k, back[:, None, :])
            store.rv[i, sel] = take(v, back[:, None, :])
    n = store.n.clone()
    n[rows] = k_new
    store.n = n


def _keys(store, i, sel, k, idx, q_old) -> None:
    """New key blocks of layer i, rows sel: k (B', H, Q, D) the kept keys as read, idx (B', H, Q) their old slots;
    a block whose G slots are an old quantized block's, unchanged, keeps its codes and metadata."""
    G = store.group
    B_, H, Q, _ = k.shape
    codes, scale, zero = store.key_rule.quantize(k)  # (B', H, Q, D*bits/8), (B', H, Q/G, D) x 2
    same = (idx == torch.arange(Q, device=idx.device)).view(B_, H, Q // G, G).all(-1)  # (B', H, Q/G)
    was_quantized = (torch.arange(Q // G, device=idx.device) + 1) * G <= q_old[:, None, None]  # (B', 1, Q/G)
    same &= was_quantized
    tok = same.repeat_interleave(G, dim=2)[..., None]  # (B', H, Q, 1)
    store.kc[i, sel, :, :Q] = torch.where(tok, store.kc[i, sel, :, :Q], codes)
    store.ks[i, sel, :, : Q // G] = torch.where(same[..., None], store.ks[i, sel, :, : Q // G], scale)
    store.kz[i, sel, :, : Q // G] = torch.where(same[..., None], store.kz[i, sel, :, : Q // G], zero)


def _values(store, i, sel, v, idx, q_old) -> None:
    """New value rows of layer i, rows sel: a kept quantized value is gathered as it is, a window value quantized."""
    codes, scale, zero = store.value_rule.quantize(v)  # (B', H, Q, D*bits/8), (B', H, Q, D/G) x 2
    was = (idx < q_old[:, None, None])[..., None]  # (B', H, Q, 1) the kept pair was quantized already
    src = idx.clamp(max=max(store.vc.shape[3] - 1, 0))
    for name, fresh in (("vc", codes), ("vs", scale), ("vz", zero)):
        x = getattr(store, name)
        held = take(x[i, sel], src)  # (B', H, Q, ·) as they were
        x[i, sel, :, : v.shape[2]] = torch.where(was, held, fresh)
