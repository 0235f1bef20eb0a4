"""KIVI's quantization rule (Liu et al., 2024), pure and vectorised over (..., N, D) tensors.

A group X of G numbers is stored as codes q = clamp(round((X - z) / s), 0, 2^b - 1) with the zero point
z = min X and the scale s = (max X - min X) / (2^b - 1) (asymmetric min/max), and read back as q * s + z.
Keys are grouped per channel: one channel over G consecutive tokens (their outlier channels get their own
range); values per token: one token over G consecutive channels. b is 8 or 4 (4-bit codes packed two per
byte, kvbench.quant.nibbles).

Arithmetic. min and max are taken in the input dtype (exact: z is one of the numbers); s is computed in
float32 and stored, like z, in the input dtype (KIVI stores them in float16, transformers in the model dtype),
rounded up (`up_to`);
codes are computed in float32 from the *stored* s and z, so a read gives q * s + z with exactly the metadata
held. A group whose numbers are all equal has s = 0: its codes are 0 and it reads back exactly.

transformers 5.24's `QuantizedCache` (quanto backend) and this rule, on the same tensors:
- its default `axis_key=axis_value=0` groups G consecutive numbers of the flattened tensor: G channels of one
  token, i.e. per-token keys *and* values (its docstring says per-channel). `axis_key=-1` gives KIVI's keys:
  G consecutive rows of the flattened (B*H*N, D) per channel, the blocks used here when G divides N (otherwise
  a group straddles two (batch, head) rows, and B*H*N not a multiple of G raises);
- quanto computes in the model dtype: in float32 codes and reads are identical to these (tested); in bfloat16
  its scale is rounded to nearest (here up, so the max is never clamped),
  (x - z) / s is rounded to bfloat16 before `round`, so a code near a half step can differ by one, and
  s * q + z is rounded twice (here once);
- a constant group gives quanto 0 / 0 = NaN codes; here 0;
- quanto has no 8-bit asymmetric codes (its int8 is symmetric, without a zero point): 8 bits are compared
  with an independent loop over the groups only;
- its layer re-quantizes everything it holds, from its reads, at each flush (a read moves by a rounding each
  time, <= 2e-6 measured in float32), and returns the flushed block unquantized at the flushing step; KIVI and
  kvbench.quant.qstore quantize each block of G tokens once, when it leaves the full-precision window
  (tests/quant/test_quanto_reference.py follows a decode through two flushes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.quant import nibbles

AXES = ("channel", "token")  # keys: per channel over G tokens; values: per token over G channels


@dataclass(frozen=True)
class Rule:
    """One quantizer: `bits` (8 or 4), `group` G numbers per scale, grouped along `axis`."""

    bits: int
    group: int
    axis: str

    def __post_init__(self):
        if self.bits not in (4, 8) or self.group < 1 or self.axis not in AXES:
            raise ValueError(f"bits 4 or 8, a positive group, axis in {AXES}: got {self}")

    @property
    def top(self) -> int:
        return 2**self.bits - 1  # the largest code

    def _grouped(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        """x (..., N, D) as (..., N/G, G, D) (channel: reduce dim -2) or (..., N, D/G, G) (token: dim -1)."""
        *lead, N, D = x.shape
        G = self.group
        if self.axis == "channel":
            if N % G:
                raise ValueError(f"per-channel groups of {G} tokens: {N} tokens is not a multiple")
            return x.reshape(*lead, N // G, G, D), -2
        if D % G:
            raise ValueError(f"per-token groups of {G} channels: head_dim {D} is not a multiple")
        return x.reshape(*lead, N, D // G, G), -1

    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (..., N, D) -> (codes, scale, zero): codes uint8 (..., N, D * bits / 8); scale and zero in x's dtype,
        (..., N/G, D) per channel or (..., N, D/G) per token."""
        xg, dim = self._grouped(x)
        lo, hi = xg.amin(dim, keepdim=True), xg.amax(dim, keepdim=True)
        zero = lo  # exact in x's dtype
        scale = up_to((hi.float() - lo.float()) / self.top, x.dtype)
        codes = self._codes(xg, scale, zero)
        return nibbles.pack(codes.reshape(x.shape), self.bits), scale.squeeze(dim), zero.squeeze(dim)

    def _codes(self, xg: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
        s = scale.float()
        s = torch.where(s > 0, s, torch.ones_like(s))  # a constant group: codes 0, read back as z
        y = xg.to(torch.float32, copy=True)
        return y.sub_(zero.float()).div_(s).round_().clamp_(0, self.top).to(torch.uint8)

    def dequantize(self, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
        """(codes, scale, zero) as `quantize` returns them -> (..., N, D) in `dtype` (default: the scale's)."""
        q = nibbles.unpack(codes, self.bits)  # (..., N, D)
        dim = -2 if self.axis == "channel" else -1
        qg, _ = self._grouped(q)
        x = qg.float().mul_(scale.unsqueeze(dim).float()).add_(zero.unsqueeze(dim).float())  # q * s + z in float32,
        # rounded after the product and after the sum as quanto does (addcmul's fused rounding differs by an ulp)
        return x.reshape(q.shape).to(scale.dtype if dtype is None else dtype)


def up_to(s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 scales in `dtype`, rounded up: z + s * (2^b - 1) still reaches the group's max, so no number is
    clamped (rounded to nearest, a bfloat16 scale 2^-9 short costs the max 255 * 2^-9 steps at 8 bits)."""
    d = s.to(dtype)
    return torch.where(d.float() < s, torch.nextafter(d, torch.full_like(d, float("inf"))), d)

