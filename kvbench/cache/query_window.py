"""SnapKV's observation window: the newest W queries each layer processed, whatever forwards they came from.

The cache keeps them per (layer, sample) as q (L_g, B, H_q, W, D), oldest first, and their source
positions as qpos (B, W) on the CPU (-1: an empty entry, fewer than W processed). Before a forward,
`advance` says where each of the W newest entries comes from in cat(kept queries, this chunk) and
moves qpos on; in the forward, `remember` gathers them, layer by layer, from the queries attention sees.
"""

from __future__ import annotations

import torch


def advance(qpos: torch.Tensor, seen: torch.Tensor, r: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(new qpos (B, W), source (B, W) of each entry in cat(old W queries, the chunk's T)) for a forward
    bringing r_b right-aligned real tokens in a chunk of `width`."""
    W, T = qpos.shape[1], width
    r = r.to(torch.long)
    e = torch.arange(W - 1, -1, -1, device="cpu")[None, :]  # (1, W) age of each entry: 0 = newest
    src = torch.where(e < r[:, None], W + T - 1 - e, W - 1 - (e - r[:, None]))  # (B, W) in cat(old, chunk)
    old = qpos.gather(1, src.clamp(0, W - 1))
    new = seen[:, None] + r[:, None] - 1 - e
    return torch.where(e < r[:, None], new, torch.where(src >= 0, old, -1)), src.clamp(min=0)


def remember(q: torch.Tensor, q_src: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """The layer's newest W queries: q (B, H_q, W, D) kept so far, query (B, H_q, T, D) this forward's."""
    both = torch.cat([q, query.to(q.dtype)], dim=2)  # (B, H_q, W + T, D)
    idx = q_src[:, None, :, None].expand(-1, both.shape[1], -1, both.shape[3])
    return both.gather(2, idx)
