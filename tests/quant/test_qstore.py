"""The quantized store: appends through the window (each block quantized once, from full precision), reads in
logical slot order, eviction (values gathered exactly, key blocks re-quantized unless unchanged), its bytes
equal to kvbench.quant.qsplit.nbytes_for, and the error compaction adds (measured here, quoted in qkeep)."""

from __future__ import annotations

import pytest
import torch

from kvbench.quant.kivi import Rule
from kvbench.quant.qsplit import nbytes_for, quantized_count
from kvbench.quant.qstore import QuantKV

L, B, H, D, G, R, C = 2, 3, 2, 16, 4, 6, 60
STEPS = [(9, [9, 5, 0]), (1, [1, 1, 1]), (7, [3, 7, 2])] + [(1, [1, 1, 1])] * 10  # (width, real tokens per row)


def filled(dtype, bits, steps=STEPS):
    """A store fed the STEPS' right-aligned chunks (pads first, as the cache's forwards bring them), with the
    full-precision pairs it was given: (store, keys (L, B, H, C, D), values, counts (B,))."""
    g = torch.Generator().manual_seed(0)
    full_k = torch.randn(L, B, H, C, D, generator=g) * torch.linspace(0.2, 4, D)
    full_k[..., 3] += 20  # an outlier channel: in bfloat16 its read is not on its 8-bit grid
    full_k = full_k.to(dtype)
    full_v = torch.randn(L, B, H, C, D, generator=g).to(dtype)
    s = QuantKV(L, B, H, C, D, dtype, "cpu", bits=bits, group=G, residual=R)
    n = torch.zeros(B, dtype=torch.long)
    for T, r in steps:
        r = torch.tensor(r)
        k, v = torch.full((L, B, H, T, D), 99.0, dtype=dtype), torch.full((L, B, H, T, D), -99.0, dtype=dtype)
        for b in range(B):
            rb = int(r[b])
            k[:, b, :, T - rb :] = full_k[:, b, :, n[b] : n[b] + rb]
            v[:, b, :, T - rb :] = full_v[:, b, :, n[b] : n[b] + rb]
        s.append(k, v, r)
        n += r
    return s, full_k, full_v, n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bits", [4, 8])
def test_append_quantizes_each_block_once_and_keeps_the_newest_exact(dtype, bits):
    s, full_k, full_v, n = filled(dtype, bits)
    kr, vr = Rule(bits, G, "channel"), Rule(bits, G, "token")
    assert torch.equal(s.n, n) and s.n.tolist() == [23, 23, 13]
    for i in range(L):
        K, V = s.read(i)
        assert K.shape == (B, H, 23, D) and K.dtype == dtype
        for b in range(B):
            nb = int(n[b])
            q = quantized_count(nb, G, R)
            assert R <= nb - q < R + G
            # what the row holds: its oldest q pairs quantized (blocks of G from slot 0), the rest as written
            ek = torch.cat([kr.dequantize(*kr.quantize(full_k[i, b, :, :q])), full_k[i, b, :, q:nb]], 1)
            ev = torch.cat([vr.dequantize(*vr.quantize(full_v[i, b, :, :q])), full_v[i, b, :, q:nb]], 1)
            assert torch.equal(K[b, :, :nb], ek) and torch.equal(V[b, :, :nb], ev)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bits", [4, 8])
def test_keeping_everything_changes_nothing(dtype, bits):
    """Unchanged key blocks keep their codes: re-quantizing a bfloat16 read would move them (8 bits)."""
    s, *_ = filled(dtype, bits)
    before = [s.read(i) for i in range(L)]
    held = {name: x.clone() for name, x in s.tensors().items()}
    N = int(s.n.max())
    kept = torch.arange(N).expand(L, B, H, N).clone()
    s.keep(torch.ones(B, dtype=torch.bool), kept, s.n.clone())
    for i in range(L):
        assert all(torch.equal(a, b) for a, b in zip(s.read(i), before[i], strict=True))
    for b, q in enumerate(s.q.tolist()):  # the codes and metadata themselves, each row's quantized slots
        for name, x in s.tensors().items():
            upto = q // G if name in ("ks", "kz") else q
            assert name.startswith("r") or torch.equal(x[:, b, :, :upto], held[name][:, b, :, :upto]), name


def random_slots(n: int, k: int, K: int, g) -> torch.Tensor:
    """The first G slots (a block kept whole), k - G others at random, then K - k copies of the last slot (as
    `select` pads a row keeping fewer)."""
    return torch.cat([torch.arange(G), G + torch.randperm(n - G, generator=g)[: k - G], torch.full((K - k,), n - 1)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bits", [4, 8])
def test_eviction_gathers_values_exactly_and_requantizes_changed_key_blocks(dtype, bits):
    s, *_ = filled(dtype, bits)
    rows = torch.tensor([True, False, True])
    keep = torch.tensor([17, 23, 9])  # rows keep different counts; row 1 untouched
    g = torch.Generator().manual_seed(1)
    K = int(keep[rows].max())
    n_rows = s.n[rows]
    kept = torch.stack([torch.stack([torch.stack([random_slots(int(nb), int(kb), K, g) for _ in range(H)])
                                     for nb, kb in zip(n_rows, keep[rows], strict=True)]) for _ in range(L)])
    kept = kept.sort(-1).values
    before = [s.read(i) for i in range(L)]
    q_old = quantized_count(n_rows, G, R)
    s.keep(rows, kept, keep)
    assert s.n.tolist() == [17, 23, 9]
    vr, kr = Rule(bits, G, "token"), Rule(bits, G, "channel")
    for i in range(L):
        k_after, v_after = s.read(i)
        assert torch.equal(k_after[1], before[i][0][1]) and torch.equal(v_after[1], before[i][1][1])  # row 1
        for j, b in enumerate(rows.nonzero()[:, 0].tolist()):
            kb, idx = int(keep[b]), kept[i, j, :, : int(keep[b])]  # (H, k_b)
            q = quantized_count(kb, G, R)
            want_k = before[i][0][b].gather(1, idx[..., None].expand(-1, -1, D))  # (H, k_b, D) as read before
            want_v = before[i][1][b].gather(1, idx[..., None].expand(-1, -1, D))
            was = (idx < q_old[j])[..., None]
            # values: a quantized one as it was; one from the window quantized now; the window exact
            again = vr.dequantize(*vr.quantize(want_v[:, :q]))
            assert torch.equal(v_after[b, :, :q], torch.where(was[:, :q], want_v[:, :q], again))
            assert torch.equal(v_after[b, :, q:kb], want_v[:, q:]) and torch.equal(k_after[b, :, q:kb], want_k[:, q:])
            # keys: each changed block re-quantized from what was read; an unchanged one as it was
            requant = kr.dequantize(*kr.quantize(want_k[:, :q]))
            for h in range(H):
                for blk in range(q // G):
                    t = slice(blk * G, blk * G + G)
                    unchanged = torch.equal(idx[h, t], torch.arange(blk * G, blk * G + G)) and blk * G + G <= q_old[j]
                    assert torch.equal(k_after[b, h, t], want_k[h, t] if unchanged else requant[h, t])


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("C_, R_, G_", [(60, 6, 4), (5, 6, 4), (64, 0, 8), (200, 128, 32), (33, 32, 1)])
def test_allocated_bytes_are_the_pure_functions(bits, dtype, C_, R_, G_):
    s = QuantKV(3, 2, 4, C_, 32, dtype, "cpu", bits=bits, group=G_, residual=R_)
    counted = sum(x.nbytes for x in s.tensors().values())
    assert counted == nbytes_for(batch_size=2, num_kv_heads=4, head_dim=32, capacity=C_, dtype=dtype, bits=bits,
                                 group=G_, residual=R_, num_layers=3)


def test_int4_is_under_a_third_of_bfloat16_at_long_contexts():
    kw = dict(batch_size=1, num_kv_heads=8, head_dim=128, capacity=4096, group=32, residual=32, num_layers=1)
    full = 2 * 8 * 4096 * 128 * 2
    assert nbytes_for(dtype=torch.bfloat16, bits=4, **kw) / full < 0.33
    assert nbytes_for(dtype=torch.bfloat16, bits=8, **kw) / full < 0.6


def test_overflow_is_refused():
    s = QuantKV(1, 1, 1, 4, 8, torch.float32, "cpu", bits=4, group=4, residual=0)
    with pytest.raises(RuntimeError, match="overflow"):
        s.append(torch.zeros(1, 1, 1, 5, 8), torch.zeros(1, 1, 1, 5, 8), torch.tensor([5]))


def compaction_error(bits, dtype, rounds=8):
    """(RMS error of the held quantized keys after each round, RMS of quantizing the same keys once): each round
    keeps a random 3/4 of every (row, head)'s pairs, then appends as many new ones."""
    g = torch.Generator().manual_seed(0)
    B_, H_, D_, G_, R_ = 2, 2, 64, 32, 32

    def fresh(T):
        k = torch.randn(1, B_, H_, T, D_, generator=g)
        k[..., 5] += 20  # an outlier channel
        return k.to(dtype)

    s = QuantKV(1, B_, H_, 512, D_, dtype, "cpu", bits=bits, group=G_, residual=R_)
    k0 = fresh(256)
    s.append(k0, k0, torch.full((B_,), 256))
    orig, rule, out = k0[0].float(), Rule(bits, G_, "channel"), []
    for _ in range(rounds):
        N = int(s.n[0])
        kept = torch.rand(1, B_, H_, N, generator=g).topk(N * 3 // 4, -1).indices.sort(-1).values
        s.keep(torch.ones(B_, dtype=torch.bool), kept, torch.full((B_,), N * 3 // 4))
        orig = orig.gather(2, kept[0][..., None].expand(-1, -1, -1, D_))
        new = fresh(N - N * 3 // 4)
        s.append(new, new, torch.full((B_,), N - N * 3 // 4))
        orig = torch.cat([orig, new[0].float()], 2)
        q = int(s.q[0])
        once = rule.dequantize(*rule.quantize(orig[:, :, :q].to(dtype))).float()
        held = s.read(0)[0][:, :, :q].float()
        out.append(((held - orig[:, :, :q]).pow(2).mean().sqrt().item(),
                    (once - orig[:, :, :q]).pow(2).mean().sqrt().item()))
    return out


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compaction_adds_a_bounded_error(bits, dtype):
    """Measured here: 1.2-1.3x a single quantization's RMS after one compaction, 1.7-1.8x after eight (4 and 8
    bits, float32 and bfloat16); it grows with each re-quantization, slowly."""
    ratios = [a / b for a, b in compaction_error(bits, dtype)]
    assert 1.0 < ratios[0] < 1.4 and ratios[-1] < 2.0 and ratios[-1] > ratios[0]


@pytest.mark.parametrize("G_, R_", [(1, 0), (8, 0), (2, 5), (4, 100)])
def test_append_and_keep_at_the_edges(G_, R_):
    """No window (G = 1, R = 0: every pair quantized at once), a window that never flushes (R over the count)."""
    g = torch.Generator().manual_seed(2)
    k, v = torch.randn(1, 2, 2, 24, 8, generator=g), torch.randn(1, 2, 2, 24, 8, generator=g)
    s = QuantKV(1, 2, 2, 24, 8, torch.float32, "cpu", bits=8, group=G_, residual=R_)
    s.append(k[..., :16, :], v[..., :16, :], torch.tensor([16, 16]))
    s.append(k[..., 16:, :], v[..., 16:, :], torch.tensor([8, 8]))
    q = quantized_count(24, G_, R_)
    kr, vr = Rule(8, G_, "channel"), Rule(8, G_ if 8 % G_ == 0 else 1, "token")
    K, V = s.read(0)
    assert torch.equal(K, torch.cat([kr.dequantize(*kr.quantize(k[0, :, :, :q])), k[0, :, :, q:]], 2))
    assert torch.equal(V, torch.cat([vr.dequantize(*vr.quantize(v[0, :, :, :q])), v[0, :, :, q:]], 2))
    kept = torch.arange(0, 24, 2).expand(1, 2, 2, 12)
    s.keep(torch.tensor([True, True]), kept, torch.tensor([12, 12]))
    K2, V2 = s.read(0)
    assert K2.shape == (2, 2, 12, 8) and torch.equal(V2[:, :, quantized_count(12, G_, R_):], V[:, :, 0::2][:, :, quantized_count(12, G_, R_):])
    assert (K2 - K[:, :, 0::2]).abs().max() < 0.05
