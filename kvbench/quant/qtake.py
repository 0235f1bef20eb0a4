"""Rows of slots taken by index, fast on the CPU: `take(x, idx)` is `x.gather(-2, idx[..., None].expand(..., D))`.

gather with an index expanded over the last dimension reads one int64 index per number; flattening to rows of D
and `index_select` reads one per row (measured ~10x faster on a CPU for (4, 3, 2048, 64) bfloat16).
"""

from __future__ import annotations

import torch


def take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x (*lead, S, D), idx (*lead', K) integer with lead' broadcastable to lead (size-1 dims broadcast) ->
    (*lead, K, D): out[..., k, :] = x[..., idx[..., k], :]."""
    *lead, S, D = x.shape
    idx = idx.expand(*lead, idx.shape[-1])
    base = torch.arange(idx[..., 0].numel(), device=x.device).view(*lead, 1) * S  # (*lead, 1) each row's first slot
    flat = x.reshape(-1, D).index_select(0, (idx + base).reshape(-1))
    return flat.view(*lead, idx.shape[-1], D)
