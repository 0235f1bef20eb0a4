"""4-bit codes packed two per byte along the last dimension (channel 2j in the low nibble, 2j + 1 in the high).

torch has no 4-bit dtype: a (..., D) tensor of codes < 16 is stored as (..., D // 2) uint8, half the bytes of
int8 codes. Packing along the channels (not the tokens) keeps every token's codes in its own row, so an
eviction that keeps a subset of tokens gathers packed rows as they are. 8-bit codes are stored unpacked.
"""

from __future__ import annotations

import torch


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes (..., D) -> stored codes: (..., D) for 8 bits, (..., D // 2) for 4 bits (D even)."""
    if bits == 8:
        return codes
    if codes.shape[-1] % 2:
        raise ValueError(f"4-bit codes pack two per byte: the last dimension ({codes.shape[-1]}) must be even")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)  # (..., D // 2)


def unpack(stored: torch.Tensor, bits: int) -> torch.Tensor:
    """Stored codes -> uint8 codes (..., D): `pack`'s inverse."""
    if bits == 8:
        return stored
    return torch.stack((stored & 15, stored >> 4), dim=-1).flatten(-2)  # (..., D // 2, 2) -> (..., D)


def packed_width(head_dim: int, bits: int) -> int:
    """Bytes one token's D codes take in a stored row."""
    return head_dim * bits // 8
