"""Appending through the residual window: new tokens join the window, whole blocks of G leave it quantized.

Row b holds n_b pairs (q_b = q(n_b) quantized, w_b = n_b - q_b in the window) and brings r_b tokens. Its
window and new tokens form one sequence of m_b = w_b + r_b; its oldest f_b = q(m_b) (kvbench.quant.qsplit:
whole blocks of G, leaving at least R) are quantized once into quantized slots q_b .. q_b + f_b - 1 (keys per
channel over each block, values per token) and the rest is the new window. Blocks already quantized are never
touched again: a block's codes are computed once, from full-precision numbers (transformers' QuantizedCache
instead re-quantizes everything it holds at each flush). Vectorised over rows and heads: the sequences are
gathered into one (B, H, max m, D) tensor, every row's candidate blocks quantized at once, and only each row's
real blocks stored (their indices built on the CPU from the counts, no device sync).
"""

from __future__ import annotations

import torch

from kvbench.quant.qsplit import quantized_count
from kvbench.quant.qtake import take


def write(store, i: int, k: torch.Tensor, v: torch.Tensor, r: torch.Tensor) -> None:
    """Append r (B,) right-aligned tokens of k, v (B, H, T, D) to layer i of `store` (its counts unchanged)."""
    G, R, dev = store.group, store.residual, store.device
    B, H, T, D = k.shape
    r = r.to(torch.long).cpu()
    n = store.n
    q = quantized_count(n, G, R)
    w = n - q  # (B,) pairs in the window
    m = w + r
    f = quantized_count(m, G, R)  # (B,) tokens leaving the window, whole blocks
    J, F = int(m.max()), int(f.max())
    if J == 0:
        return
    cr = store.rk.shape[3]
    j = torch.arange(J)[None, :]
    # sequence position j of row b: window slot j, then the new tokens (the last r_b columns of the chunk)
    src = torch.where(j < w[:, None], j, cr + T - r[:, None] + j - w[:, None]).clamp(0, cr + T - 1)
    src = src.to(dev)[:, None, :]  # (B, 1, J)
    seq_k = take(torch.cat([store.rk[i], k.to(store.dtype)], dim=2), src)  # (B, H, J, D)
    seq_v = take(torch.cat([store.rv[i], v.to(store.dtype)], dim=2), src)
    if F:
        flush(store, i, seq_k[:, :, :F], seq_v[:, :, :F], q, f)
    if cr:  # the new window: sequence positions f_b .. m_b - 1 (slots past w'_b hold junk)
        back = (f[:, None] + torch.arange(cr)[None, :]).clamp(max=J - 1).to(dev)[:, None, :]  # (B, 1, C_r)
        store.rk[i] = take(seq_k, back)
        store.rv[i] = take(seq_v, back)


def flush(store, i: int, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor, f: torch.Tensor) -> None:
    """Quantize the blocks k, v (B, H, F, D) (row b's first f_b (B,) tokens real) into layer i's quantized slots
    from q_b (B,) on."""
    G, dev = store.group, store.device
    F = k.shape[2]
    kc, ks, kz = store.key_rule.quantize(k)  # (B, H, F, D*bits/8), (B, H, F/G, D) x 2
    vc, vs, vz = store.value_rule.quantize(v)  # (B, H, F, D*bits/8), (B, H, F, D/G) x 2
    b, t = (torch.arange(F)[None, :] < f[:, None]).nonzero(as_tuple=True)  # every token to store (CPU)
    dst = q[b] + t
    b, t, dst = b.to(dev), t.to(dev), dst.to(dev)
    store.kc[i, b, :, dst] = kc[b, :, t]
    store.vc[i, b, :, dst] = vc[b, :, t]
    store.vs[i, b, :, dst] = vs[b, :, t]
    store.vz[i, b, :, dst] = vz[b, :, t]
    b, blk = (torch.arange(F // G)[None, :] < (f // G)[:, None]).nonzero(as_tuple=True)  # every key block
    dst = (q[b] // G + blk).to(dev)
    b, blk = b.to(dev), blk.to(dev)
    store.ks[i, b, :, dst] = ks[b, :, blk]
    store.kz[i, b, :, dst] = kz[b, :, blk]
