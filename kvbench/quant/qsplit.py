"""Where each held pair lives, and what a store allocates: pure arithmetic on the counts (CPU, no tensor data).

A row holding n pairs keeps its oldest q(n) = G * floor(max(n - R, 0) / G) quantized, in whole blocks of G
tokens (a key block: one scale and zero point per channel), and the newest n - q(n) in full precision: the
residual window, R <= n - q(n) < R + G once n >= R (every pair while n < R). So the window always holds at
least the newest R pairs (KIVI keeps 0 to R; here R to R + G - 1, flushing one whole block at a time) and q is
a function of n alone: an append or an eviction to n pairs lays the row out again by the same rule.

A store of capacity C pairs per row allocates C_q = q(C) quantized slots and C_r = min(C, R + G - 1) residual
slots: no row of at most C pairs needs more (n - q(n) <= min(n, R + G - 1)).
"""

from __future__ import annotations

import torch

from kvbench.quant import nibbles


def quantized_count(n, group: int, residual: int):
    """q(n): pairs held quantized by a row of n (an int, or a (B,) integer tensor)."""
    if isinstance(n, torch.Tensor):
        return (n - residual).clamp(min=0).div(group, rounding_mode="floor") * group
    return max(n - residual, 0) // group * group


def capacities(capacity: int, group: int, residual: int) -> tuple[int, int]:
    """(C_q, C_r): quantized slots (a multiple of G) and full-precision residual slots per row."""
    return quantized_count(capacity, group, residual), min(capacity, residual + group - 1)


def nbytes_for(*, batch_size: int, num_kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype, bits: int,
               group: int, residual: int, num_layers: int = 1) -> int:
    """Bytes a `QuantKV` store of these dimensions allocates: codes + scales + zero points + residual window,
    keys and values (kvbench.quant.qstore allocates from `capacities` too; a test checks the tensors' nbytes)."""
    cq, cr = capacities(capacity, group, residual)
    rows = num_layers * batch_size * num_kv_heads
    e = torch.empty(0, dtype=dtype).element_size()
    codes = 2 * cq * nibbles.packed_width(head_dim, bits)  # uint8 codes, keys and values
    key_meta = 2 * (cq // group) * head_dim * e  # scale + zero per channel per block of G tokens
    value_meta = 2 * cq * (head_dim // group) * e  # scale + zero per token per G channels
    window = 2 * cr * head_dim * e  # keys and values in full precision
    return rows * (codes + key_meta + value_meta + window)
