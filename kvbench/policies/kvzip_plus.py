"""KVzip+: KVzip's reconstruction weights normalised by what a pair writes (the KVzap paper, Jegou et al., 2026,
arXiv 2601.07891; kvpress 0.5.5's `KVzipPress(kvzip_plus_normalization=True)`).

Each weight a pass token t of query head (h, g) gives a chunk's pair is divided by the L2 norm of t's hidden state
entering the layer's attention and multiplied by ||W_O^(h,g) v||_2, the norm of the pair's value through the
output projection's columns of that query head (`o_proj.weight`); the rest is KVzip's (kvbench.policies.kvzip).
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.policies.kvzip import KVzip


@dataclass
class KVzipPlus(KVzip):
    name: ClassVar[str] = "kvzip_plus"
    label: ClassVar[str] = "KVzip+"
    summary: ClassVar[str] = "KVzip's reconstruction attention / the querying token's norm x the value's output norm"
    paper: ClassVar[tuple[str, str]] = ("Jegou et al., 2026 (KVzap)", "https://arxiv.org/abs/2601.07891")

    def weigh(self, w: torch.Tensor, ctx, H: int, G: int) -> torch.Tensor:
        """w (B, H, G, T, N) x 1 / ||h_t|| x ||W_O^(h,g) v||, in the model's dtype as kvpress computes them."""
        h = ctx.hidden  # (B, T, hidden)
        w = w * (1 / torch.linalg.vector_norm(h, dim=-1))[:, None, None, :, None]
        return w * value_out_norms(ctx.module.o_proj.weight, ctx.values, H, G)[:, :, :, None, :]

    def pass_bytes(self, *, rows, kv_heads, q_heads, tokens, pairs, head_dim, elem) -> int:
        """KVzip's, or after its logits are freed: the softmax, two normalised copies of the chunk's weights, the
        value norms (B, H, G, N) and one KV head's product through o_proj (B, G, N, hidden ~ H_q D)."""
        base = super().pass_bytes(rows=rows, kv_heads=kv_heads, q_heads=q_heads, tokens=tokens, pairs=pairs,
                                  head_dim=head_dim, elem=elem)
        keys = rows * kv_heads * (pairs + tokens) * head_dim * elem
        soft = rows * q_heads * tokens * (pairs + tokens) * elem
        out = rows * q_heads * pairs * elem + rows * (q_heads // kv_heads) * pairs * q_heads * head_dim * elem
        return max(base, keys + soft + 2 * rows * q_heads * tokens * pairs * elem + out)

def value_out_norms(o_weight: torch.Tensor, values: torch.Tensor, H: int, G: int) -> torch.Tensor:
    """(B, H, G, N) ||W_O^(h,g) v||_2 of each held value v (B, H, N, D) through o_proj's weight (hidden, H G D),
    one KV head at a time (the (B, G, N, hidden) product of a head, not of the layer, is alive)."""
    B, _, N, D = values.shape
    wo = o_weight.t().reshape(H, G, D, -1)  # (H, G, D, hidden)
    out = torch.empty(B, H, G, N, dtype=values.dtype, device=values.device)
    for kv in range(H):
        out[:, kv] = torch.linalg.vector_norm(torch.einsum("gdo,bnd->bgno", wo[kv], values[:, kv]), dim=-1)
    return out
