"""A forward's mask (kvbench.cache.layout.visible): chunk row i of sample b sees slot c iff c - i <= thresh_b, and
c - i > thresh_b - W in a windowed band; the one (B, T, N) tensor it allocates is the bool mask itself (what the
memory account charges), with a band too."""

from __future__ import annotations

import pytest
import torch

from kvbench.cache.layout import visible
from tests.memory.test_account import AllocatedBytes


@pytest.mark.parametrize("T,N,W", [(1, 5, None), (4, 9, None), (7, 7, 3), (5, 20, 4), (3, 10, 16), (20, 40, 5),
                                   (1, 17, 16), (300, 340, None), (300, 340, 16)])
def test_the_mask_is_the_rule_in_one_bool_tensor(T, N, W):
    thresh = torch.tensor([N - T, N - T - 2, -1, N - T - 5, -T])  # (B,): counts after the write less T
    c, i = torch.arange(N), torch.arange(T)
    d = c[None, None, :] - i[None, :, None] - thresh[:, None, None]  # (B, T, N) int64: the reference
    want = (d <= 0) & (d > -W) if W is not None else d <= 0
    with AllocatedBytes() as measured:
        got = visible(thresh, T, N, W)
    assert torch.equal(got, want) and got.is_contiguous()
    assert measured.peak <= got.numel() + 16 * len(thresh) * T + 1024, (measured.peak, got.numel())
