"""The quantized paged pool (kvbench.serve.qpool) against the page-wise rule written out by hand, and its bytes.

- `pairs` reads what a brute-force reference of the rule gives: per (layer, KV head) a list of pages, each quantized
  by kvbench.quant.kivi's `Rule` (proven against transformers' quanto) once it is full and R newer pairs follow it,
  from its full-precision pairs, else held as written; appends in chunks that start and end inside pages, and
  evictions of whole pages (quantized ones and window ones) as the block manager applies them;
- the pool's bytes, counted from its dimensions (what `pool_blocks` charges a memory limit), equal its tensors'
  allocation, and an int4 block's K/V is below 0.35 of the model dtype's at a real model's head size.
"""

from __future__ import annotations

import pytest
import torch

from kvbench.quant.kivi import Rule
from kvbench.quant.qconfig import KVQuant
from kvbench.serve import qpool
from kvbench.serve.blocks import BlockManager
from kvbench.serve.qpool import QuantPagedPool
from kvbench.serve.request import Request

L, H, D, BS = 2, 2, 16, 8


class Reference:
    """One (layer, KV head)'s pages, the rule applied by hand: [fp keys, fp values, read keys, read values, done]."""

    def __init__(self, bits: int, residual: int):
        self.kr, self.vr, self.R = Rule(bits, BS, "channel"), Rule(bits, BS, "token"), residual
        self.pages: list[list] = []

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        for t in range(k.shape[0]):
            if not self.pages or self.pages[-1][0].shape[0] == BS:
                self.pages.append([k[:0], v[:0], None, None, False])
            p = self.pages[-1]
            p[0], p[1] = torch.cat([p[0], k[t:t + 1]]), torch.cat([p[1], v[t:t + 1]])
        n = sum(p[0].shape[0] for p in self.pages)
        for j, p in enumerate(self.pages):
            if not p[4] and (j + 1) * BS <= n - self.R:  # full, and R newer pairs after it
                p[2] = self.kr.dequantize(*self.kr.quantize(p[0]))
                p[3] = self.vr.dequantize(*self.vr.quantize(p[1]))
                p[4] = True

    def read(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.cat([p[2] if p[4] else p[0] for p in self.pages]),
                torch.cat([p[3] if p[4] else p[1] for p in self.pages]))


def _slots(req: Request, n: int, start: torch.Tensor) -> torch.Tensor:
    logical = start[..., None] + torch.arange(n)  # (L, H, n)
    return req.pages.gather(-1, logical // BS) * BS + logical % BS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("bits", "residual"), [(4, 0), (8, 5), (4, 8)])
def test_pool_reads_the_page_wise_rule(bits, residual, dtype, monkeypatch):
    g = torch.Generator().manual_seed(bits + residual)
    pool = QuantPagedPool(num_layers=L, num_blocks=12, block_size=BS, num_kv_heads=H, head_dim=D, dtype=dtype,
                          device="cpu", track_attention=False, quant=KVQuant(bits, BS, residual),
                          window_pages=qpool.window_pages_for(num_layers=L, num_kv_heads=H, block_size=BS,
                                                              residual=residual, max_running=1))
    bm = BlockManager(12, BS, (L, H))
    bm.on_give = pool.given_back
    req = Request(rid=0, prompt=[0], max_new_tokens=1)
    bm.admit(req)
    ref = [[Reference(bits, residual) for _ in range(H)] for _ in range(L)]
    # chunks (tokens fed) and, before some, the full logical blocks (layer, head, block) evicted: quantized pages
    # and (residual 8: the third of 30 pairs) a window page
    plan = [(5, []), (14, []), (1, []), (9, [(0, 0, 0), (1, 1, 1)]), (1, []), (17, [(0, 1, 1), (1, 0, 2)]), (3, [])]
    for n, evict in plan:
        if evict:
            which = torch.zeros(*req.pages.shape, dtype=torch.bool)
            for la, h, b in evict:
                which[la, h, b] = True
                del ref[la][h].pages[b]
            bm.evict(req, which)
        before = req.held.clone()
        bm.grow(req, n)
        pool.prepare([req.pages], [req.held], [n])
        slots = _slots(req, n, before)  # (L, H, n)
        k = (torch.randn(L, 1, H, n, D, generator=g) * torch.linspace(0.1, 4, D)).to(dtype)  # channels: own ranges
        v = torch.randn(L, 1, H, n, D, generator=g).to(dtype)
        for la in range(L):
            pool.write_pairs(la, slots[la].T, k[la], v[la])
            for h in range(H):
                ref[la][h].append(k[la, 0, h], v[la, 0, h])
        bm.advance(req, n)
        slots_held = pool.slots(req.pages, req.held)[0]
        got_k, got_v = pool.pairs(slots_held)  # (L, H, N, D)
        unpacked = []  # one of the two asked: the other's codes are not unpacked (nor dequantized)
        with monkeypatch.context() as m:
            m.setattr(qpool.nibbles, "unpack", lambda x, b, f=qpool.nibbles.unpack, seen=unpacked: seen.append(x.shape) or f(x, b))
            assert torch.equal(pool.pairs(slots_held, "k"), got_k) and len(unpacked) == 1
            assert torch.equal(pool.pairs(slots_held, "v"), got_v) and len(unpacked) == 2
        for la in range(L):
            for h in range(H):
                want_k, want_v = ref[la][h].read()
                m = int(req.held[la, h])
                assert m == want_k.shape[0]
                assert torch.equal(got_k[la, h, :m], want_k) and torch.equal(got_v[la, h, :m], want_v)
    assert any(p[4] for r in ref[0] for p in r.pages) and any(not p[4] for r in ref[0] for p in r.pages)
    bm.free(req)
    assert len(pool.free_window) == pool.fk.shape[0]  # every window page back


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("track", [False, True])
def test_pool_bytes_are_its_allocation(bits, track):
    dims = dict(num_layers=3, num_blocks=5, block_size=16, num_kv_heads=2, head_dim=32, dtype=torch.bfloat16,
                track_attention=track)
    pool = QuantPagedPool(**dims, device="cpu", quant=KVQuant(bits, 16, 16), window_pages=7)
    assert pool.nbytes() == qpool.nbytes_for(**dims, bits=bits, window_pages=7)


def test_an_int4_block_is_below_035_of_the_model_dtype_at_head_size_128():
    dims = dict(num_layers=1, num_blocks=1, block_size=32, num_kv_heads=1, head_dim=128, dtype=torch.bfloat16,
                device="meta", track_attention=False)
    plain = qpool.PagedPool(**dims).kv_block_bytes()
    int4 = QuantPagedPool(**dims, quant=KVQuant(4, 32, 32), window_pages=0).kv_block_bytes()
    assert int4 < 0.35 * plain, (int4, plain)


def test_group_must_be_the_page():
    with pytest.raises(ValueError, match="block_size"):
        QuantPagedPool(num_layers=1, num_blocks=1, block_size=16, num_kv_heads=1, head_dim=16, dtype=torch.float32,
                       device="cpu", track_attention=False, quant=KVQuant(4, 8, 0), window_pages=1)


def test_a_memory_limit_sizes_the_quantized_pool_by_its_allocation(tiny_llama):
    """pool_blocks under memory.limit_gb: the window pages first, then whole quantized blocks; the pool of that many
    blocks allocates exactly what the limit was charged."""
    from omegaconf import OmegaConf

    from kvbench import memory
    from kvbench.policies import Full
    from kvbench.serve.run import pool_blocks

    q = KVQuant(4, 16, 16)
    cfg = OmegaConf.create({"serve": {"num_blocks": None, "block_size": 16, "max_running": 3}})
    dims = dict(num_layers=2, block_size=16, num_kv_heads=2, head_dim=16, dtype=tiny_llama.model.dtype,
                track_attention=False)
    window = qpool.window_pages_for(num_layers=2, num_kv_heads=2, block_size=16, residual=16, max_running=3)
    weights = sum(memory.ModelShape.of(tiny_llama.model).weights.values())
    charged = qpool.nbytes_for(**dims, num_blocks=10, bits=4, window_pages=window)
    per = qpool.nbytes_for(**dims, num_blocks=1, bits=4, window_pages=0)
    assert pool_blocks(cfg, tiny_llama, Full(), memory.MemoryLimit((weights + charged + per // 2) / memory.GiB), q) == 10
    pool = QuantPagedPool(**dims, num_blocks=10, device="cpu", quant=q, window_pages=window)
    assert pool.nbytes() == charged
    plain = qpool.PagedPool.block_bytes(**dims)  # at a limit that holds 200 blocks in the model's dtype, more blocks
    limit = memory.MemoryLimit((weights + 200.5 * plain) / memory.GiB)  # (at 10, the window pages take them all)
    assert pool_blocks(cfg, tiny_llama, Full(), limit) == 200 < pool_blocks(cfg, tiny_llama, Full(), limit, q)
