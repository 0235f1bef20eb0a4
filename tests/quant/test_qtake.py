"""`take` is gather along the slots, an index broadcast over heads, in float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch

from kvbench.quant.qtake import take


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8])
def test_take_is_gather(dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 2, 9, 5, generator=g) * 10).to(dtype)  # (B, H, S, D)
    per_row = torch.randint(0, 9, (3, 1, 7), generator=g)  # one index per row, every head
    per_head = torch.randint(0, 9, (3, 2, 7), generator=g)
    for idx in (per_row, per_head):
        want = x.gather(2, idx.expand(3, 2, 7)[..., None].expand(-1, -1, -1, 5))
        assert torch.equal(take(x, idx), want)
