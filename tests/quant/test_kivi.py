"""KIVI's rule against a reference written independently: loops over every group (which numbers share a scale,
where each code lands in the packed bytes), in float32 and bfloat16, 8 and 4 bits, keys and values."""

from __future__ import annotations

import pytest
import torch

from kvbench.quant.kivi import Rule


def loop_reference(x: torch.Tensor, bits: int, G: int, axis: str):
    """(codes (..., N, D) unpacked, read-back (..., N, D) float32, half step (..., N, D)) by looping over groups."""
    *lead, N, D = x.shape
    flat = x.reshape(-1, N, D)
    codes = torch.zeros(flat.shape, dtype=torch.long)
    back = torch.zeros(flat.shape, dtype=torch.float32)
    half = torch.zeros(flat.shape, dtype=torch.float32)
    top = 2**bits - 1
    for r in range(flat.shape[0]):
        groups = ([(slice(t, t + G), d) for t in range(0, N, G) for d in range(D)] if axis == "channel"
                  else [(t, slice(c, c + G)) for t in range(N) for c in range(0, D, G)])
        for idx in groups:
            g = flat[r][idx]
            lo, hi = float(g.min()), float(g.max())
            exact = float(torch.tensor((hi - lo) / top, dtype=torch.float32))
            s = torch.tensor(exact).to(x.dtype)
            if float(s) < exact:  # the scale is stored rounded up: the group's max is never clamped
                s = torch.nextafter(s, torch.tensor(float("inf"), dtype=x.dtype))
            s = float(s)
            q = [min(max(round((float(v) - lo) / s), 0), top) if s > 0 else 0 for v in g.flatten()]
            q = torch.tensor(q).reshape(g.shape)
            codes[r][idx], back[r][idx], half[r][idx] = q, q * s + lo, s / 2
    return codes.reshape(x.shape), back.reshape(x.shape), half.reshape(x.shape)


def unpacked(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Independent unpacking: byte j holds channels 2j (low nibble) and 2j + 1 (high)."""
    if bits == 8:
        return codes.long()
    out = torch.zeros(*codes.shape[:-1], codes.shape[-1] * 2, dtype=torch.long)
    out[..., 0::2], out[..., 1::2] = codes.long() % 16, codes.long() // 16
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("axis", ["channel", "token"])
def test_codes_and_reads_match_a_loop_over_groups(dtype, bits, axis):
    torch.manual_seed(0)
    G = 4
    x = (torch.randn(2, 2, 8, 8) * torch.linspace(0.1, 5, 8)).to(dtype)  # (B, H, N, D), channels of unequal range
    x[0, 0, :4, 3] = 1.5  # a constant key group (and part of a value group)
    rule = Rule(bits, G, axis)
    codes, scale, zero = rule.quantize(x)
    assert codes.dtype == torch.uint8 and codes.shape == (2, 2, 8, 8 * bits // 8)
    assert scale.shape == zero.shape == ((2, 2, 2, 8) if axis == "channel" else (2, 2, 8, 2))
    assert scale.dtype == zero.dtype == dtype
    ref_codes, ref_back, half = loop_reference(x, bits, G, axis)
    mine = unpacked(codes, bits)
    # bfloat16: the loop divides in float64, the rule in float32: a code exactly at a half step may differ by one
    assert (mine - ref_codes).abs().max() <= (0 if dtype == torch.float32 else 1)
    assert (mine != ref_codes).float().mean() < 0.01
    back = rule.dequantize(codes, scale, zero, torch.float32)
    tol = 1e-6 if dtype == torch.float32 else 2 * half.max().item()
    assert torch.allclose(back, ref_back, atol=tol)
    err = (back - x.float()).abs()
    assert (err <= half * (1 + 1e-5) + 1e-6).all()  # within half a step of the number's own group
    assert rule.dequantize(codes, scale, zero).dtype == dtype
    if axis == "channel":  # the constant group reads back exactly
        assert torch.equal(back[0, 0, :4, 3], torch.full((4,), 1.5)) and (scale[0, 0, 0, 3] == 0)


def test_keys_per_channel_beat_per_token_on_outlier_channels():
    """KIVI's reason for per-channel keys: a channel of large magnitude spoils every per-token group."""
    torch.manual_seed(1)
    k = torch.randn(1, 2, 64, 32)
    k[..., 5] = 40 + torch.randn(1, 2, 64)  # an outlier channel, as in real keys
    errs = {}
    for axis in ("channel", "token"):
        rule = Rule(4, 32, axis)
        errs[axis] = (rule.dequantize(*rule.quantize(k)) - k).pow(2).mean().sqrt().item()
    assert errs["channel"] < errs["token"] / 4


def test_bad_groups_are_refused():
    with pytest.raises(ValueError, match="not a multiple"):
        Rule(4, 32, "token").quantize(torch.zeros(1, 1, 32, 48))
    with pytest.raises(ValueError, match="not a multiple"):
        Rule(4, 32, "channel").quantize(torch.zeros(1, 1, 40, 64))
    with pytest.raises(ValueError):
        Rule(3, 32, "channel")
