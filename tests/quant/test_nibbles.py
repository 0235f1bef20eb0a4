"""4-bit packing: two codes per byte, channel order kept, half the bytes; 8-bit codes untouched."""

from __future__ import annotations

import pytest
import torch

from kvbench.quant import nibbles


def test_pack_two_per_byte_and_back():
    codes = torch.randint(0, 16, (2, 3, 5, 8), dtype=torch.uint8)
    p = nibbles.pack(codes, 4)
    assert p.shape == (2, 3, 5, 4) and p.dtype == torch.uint8
    assert int(p[0, 0, 0, 1]) == int(codes[0, 0, 0, 2]) + 16 * int(codes[0, 0, 0, 3])
    assert torch.equal(nibbles.unpack(p, 4), codes)
    assert nibbles.packed_width(8, 4) == 4 and nibbles.packed_width(8, 8) == 8


def test_eight_bits_are_stored_as_they_are():
    codes = torch.randint(0, 256, (4, 6), dtype=torch.uint8)
    assert nibbles.pack(codes, 8) is codes and nibbles.unpack(codes, 8) is codes


def test_odd_width_is_refused():
    with pytest.raises(ValueError, match="even"):
        nibbles.pack(torch.zeros(2, 3, dtype=torch.uint8), 4)
