"""kvbench's KIVI rule against transformers' own `QuantizedCache` layer with the quanto backend, on the same
tensors, where the rule is the same: 4 bits, `axis_key=-1` (per channel, G consecutive tokens: the same blocks
when G divides N) and `axis_value=0` (per token, G consecutive channels). Skipped where optimum-quanto is not
installed (`pip install --no-deps optimum-quanto`: it runs on the CPU torch as it is).

float32: identical codes and identical reads. bfloat16: quanto divides in bfloat16 before rounding and rounds its
scale to nearest, so some codes differ by one (measured: about 3% of them here); kvbench's read is the closer
to the original numbers (lower RMS error), which the test asserts.

Over a decode with flushes (kvbench's store with R = 0 holds 0 to G - 1 pairs in its window, transformers' layer
with residual_length = G the same), the reads are the same but for two differences of transformers' flow: at the
step that flushes, it returns the flushed block as it was given (the quantized block is only read from the next
step on), and each flush re-quantizes every block it holds from its read, which moves a read by a rounding
(measured: <= 2e-6 here) where kvbench leaves quantized blocks as they are.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("optimum.quanto")
from optimum.quanto.tensor.grouped import ungroup  # noqa: E402
from transformers.cache_utils import QuantoQuantizedLayer  # noqa: E402

from kvbench.quant import nibbles  # noqa: E402
from kvbench.quant.kivi import Rule  # noqa: E402
from kvbench.quant.qstore import QuantKV  # noqa: E402

G = 32
AXES = {"channel": -1, "token": 0}  # kvbench's grouping -> quanto's axis


def tensors(dtype):
    torch.manual_seed(0)
    k = torch.randn(2, 3, 64, 64) * torch.linspace(0.1, 5, 64)  # (B, H_kv, N, D), channels of unequal range
    k[..., 7] += 30  # an outlier channel
    return k.to(dtype), torch.randn(2, 3, 64, 64).to(dtype)


def quanto_codes(layer, x, axis):
    qt = layer._quantize(x.contiguous(), axis=AXES[axis])
    return ungroup(qt._data.unpack(), AXES[axis], x.shape), layer._dequantize(qt)


@pytest.mark.parametrize("axis", ["channel", "token"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_codes_and_reads_as_quanto(axis, dtype):
    layer = QuantoQuantizedLayer(nbits=4, axis_key=-1, axis_value=0, q_group_size=G)
    k, v = tensors(dtype)
    x = k if axis == "channel" else v
    theirs, their_read = quanto_codes(layer, x, axis)
    rule = Rule(4, G, axis)
    codes, scale, zero = rule.quantize(x)
    mine, my_read = nibbles.unpack(codes, 4), rule.dequantize(codes, scale, zero)
    if dtype == torch.float32:
        assert torch.equal(mine, theirs) and torch.equal(my_read, their_read)
    else:
        diff = (mine.int() - theirs.int()).abs()
        assert diff.max() <= 1 and diff.float().mean() < 0.06
        rms = {n: (r.float() - x.float()).pow(2).mean().sqrt() for n, r in (("mine", my_read), ("quanto", their_read))}
        assert rms["mine"] <= rms["quanto"]


def test_the_cache_layer_returns_kvbench_reads_of_the_prompt():
    """transformers' layer itself: a 64-token prompt quantized at the first `update`, read back (dequantized)
    at the next one, before any flush (residual 128), as kvbench reads it."""
    k, v = tensors(torch.float32)
    layer = QuantoQuantizedLayer(nbits=4, axis_key=-1, axis_value=0, q_group_size=G, residual_length=128)
    layer.update(k, v)
    k1, v1 = torch.randn(2, 3, 1, 64), torch.randn(2, 3, 1, 64)
    keys, values = layer.update(k1, v1)  # (B, H, 65, D): the read prompt, then the new token as it is
    kr, vr = Rule(4, G, "channel"), Rule(4, G, "token")
    assert torch.equal(keys[:, :, :64], kr.dequantize(*kr.quantize(k)))
    assert torch.equal(values[:, :, :64], vr.dequantize(*vr.quantize(v)))
    assert torch.equal(keys[:, :, 64:], k1)


def test_transformers_default_axes_are_per_token_keys():
    """`QuantizedCache`'s default axis_key=0 groups G channels of one token (per-token keys), not KIVI's rule."""
    k, _ = tensors(torch.float32)
    layer = QuantoQuantizedLayer(nbits=4, axis_key=0, axis_value=0, q_group_size=G)
    theirs = ungroup(layer._quantize(k.contiguous(), axis=0)._data.unpack(), 0, k.shape)
    assert torch.equal(nibbles.unpack(Rule(4, G, "token").quantize(k)[0], 4), theirs)
    assert not torch.equal(nibbles.unpack(Rule(4, G, "channel").quantize(k)[0], 4), theirs)


def test_a_decode_with_flushes_reads_as_transformers_layer():
    g = torch.Generator().manual_seed(0)
    k = torch.randn(2, 3, 134, 64, generator=g) * torch.linspace(0.1, 5, 64)
    k[..., 7] += 30
    v = torch.randn(2, 3, 134, 64, generator=g)
    layer = QuantoQuantizedLayer(nbits=4, axis_key=-1, axis_value=0, q_group_size=G, residual_length=G)
    store = QuantKV(1, 2, 3, 134, 64, torch.float32, "cpu", bits=4, group=G, residual=0)
    layer.update(k[:, :, :64], v[:, :, :64])
    store.append(k[None, :, :, :64], v[None, :, :, :64], torch.tensor([64, 64]))
    for t in range(64, 134):  # one token a step: transformers flushes at 96 and 128 pairs, as kvbench does
        theirs = layer.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
        store.append(k[None, :, :, t : t + 1], v[None, :, :, t : t + 1], torch.tensor([1, 1]))
        mine, n = store.read(0), t + 1
        fresh = n - G if n % G == 0 else n  # at a flush, transformers returns the flushed block unquantized
        for a, b, x in zip(theirs, mine, (k, v), strict=True):
            if n < 96:
                assert torch.equal(a, b)  # no flush yet since the prompt
            assert (a[:, :, :fresh] - b[:, :, :fresh]).abs().max() <= 2e-6  # transformers' re-quantized reads
            assert torch.equal(a[:, :, fresh:], x[:, :, fresh:n])
            assert fresh == n or not torch.equal(b[:, :, fresh:], x[:, :, fresh:n])  # kvbench reads it quantized
