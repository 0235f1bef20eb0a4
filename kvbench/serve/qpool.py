"""The paged pool with quantized K/V (`gen.kv_cache_dtype=int8|int4`): KIVI's rule (kvbench.quant.kivi) page by page.

A page is the quantization unit: G = `gen.kv_quant_group` must equal `serve.block_size`, so a full page is one
key group per channel (keys per channel over the page's G tokens) and values are per token over G channels.
Each (request, layer, KV head)'s newest pages are held in full precision (KIVI's residual window): a page is
quantized once, when it is full and at least R = `gen.kv_quant_residual` newer pairs follow it in its table, from
its full-precision pairs, and never again (serve evicts whole pages: the kept pages' groups do not change). With
no eviction this is the static cache's rule exactly (kvbench.quant.qsplit: its quantized count q(n) is a whole
number of pages); when eviction takes pages out of the window, the pages left stay as they are (the static cache
counts its window afresh from the pairs it holds and re-quantizes the key blocks whose tokens changed).

Per page id p of the P = num_blocks x layers x KV heads pages (whether in use or not):

    kc, vc   (P, bs, D * bits / 8)  uint8 codes, one row per token (4 bits: two a byte)
    ks, kz   (P, D)                 keys' scale and zero point per channel (one group: the page)
    vs, vz   (P, bs, D / G)         values' scale and zero point per token and G channels

and `window_pages` full-precision pages `fk`, `fv` (F, bs, D) that pages not yet quantized borrow (`fpage[p]`: the
window page page p holds its pairs in, -1 once quantized or free). A running (request, layer, KV head) borrows at
most ceil((R + bs - 1) / bs) of them, and twice that in the layer being written (its old window and its new one);
a page that fills and leaves the window in one forward (a prompt's chunk) is quantized from the forward's new
pairs and borrows none. So F is sized from `serve.max_running` (required, `window_pages_for`) and counted in the
pool's bytes (`nbytes_for`, equal to the tensors' allocation). Reads dequantize each held slot from its page's
codes, or take it from its window page (`pairs`): what attention, the policies' scores and their passes see; a
first chunk too reads its pairs back from the pool (the pages it filled and quantized), not as computed.
"""

from __future__ import annotations

import torch

from kvbench.quant import nibbles
from kvbench.quant.kivi import Rule
from kvbench.serve.blocks import blocks_for
from kvbench.serve.pool import PagedPool


def window_pages_for(*, num_layers: int, num_kv_heads: int, block_size: int, residual: int, max_running: int) -> int:
    """Full-precision pages a quantized pool needs at most: each running request's window in every layer and KV
    head (at most ceil((R + bs - 1) / bs) pages), and in the layer being written its new window as well as its old
    one (whose pages leave once the layer is written); pages that fill and leave in one forward borrow none."""
    return max_running * (num_layers + 1) * num_kv_heads * blocks_for(residual + block_size - 1, block_size)


def quant_page_bytes(*, block_size: int, head_dim: int, dtype: torch.dtype, bits: int) -> int:
    """Bytes of one page's quantized K/V: codes, keys' per-channel and values' per-token scales and zero points."""
    e = torch.empty((), dtype=dtype).element_size()
    codes = 2 * block_size * nibbles.packed_width(head_dim, bits)
    return codes + 2 * head_dim * e + 2 * block_size * (head_dim // block_size) * e


def nbytes_for(*, num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, track_attention, bits: int,
               window_pages: int, own: int = 0) -> int:
    """What a `QuantPagedPool` of these dimensions allocates (a test checks it against the tensors' nbytes)."""
    pages = num_blocks * num_layers * num_kv_heads
    plain = PagedPool.block_bytes(num_layers=num_layers, block_size=block_size, num_kv_heads=num_kv_heads,
                                  head_dim=head_dim, dtype=dtype, track_attention=track_attention, own=own)
    e = torch.empty((), dtype=dtype).element_size()
    kv = 2 * block_size * head_dim * e * num_layers * num_kv_heads  # a block's K/V in the model's dtype
    per_page = quant_page_bytes(block_size=block_size, head_dim=head_dim, dtype=dtype, bits=bits)
    window = window_pages * 2 * block_size * head_dim * e
    return num_blocks * (plain - kv) + pages * (per_page + 8) + window  # + fpage (int64 per page)


class QuantPagedPool(PagedPool):
    def __init__(self, *, quant, window_pages: int, **kw):
        dtype, device, D, bs = kw["dtype"], kw["device"], kw["head_dim"], kw["block_size"]
        if quant.group != bs:
            raise ValueError(f"a quantized pool's page is its key group: gen.kv_quant_group ({quant.group}) must equal "
                             f"serve.block_size ({bs})")
        super().__init__(**kw, kv=False)
        self.quant, self.dtype = quant, dtype
        self.key_rule, self.value_rule = Rule(quant.bits, bs, "channel"), Rule(quant.bits, quant.group, "token")
        P, W = self.num_pages, nibbles.packed_width(D, quant.bits)
        self.kc, self.vc = (torch.zeros(P, bs, W, dtype=torch.uint8, device=device) for _ in "kv")  # codes
        self.ks, self.kz = (torch.zeros(P, D, dtype=dtype, device=device) for _ in "sz")  # keys' scales, zeros
        self.vs = torch.zeros(P, bs, D // quant.group, dtype=dtype, device=device)
        self.vz = torch.zeros_like(self.vs)
        self.fk = torch.zeros(window_pages, bs, D, dtype=dtype, device=device)
        self.fv = torch.zeros_like(self.fk)
        self.fpage = torch.full((P,), -1, dtype=torch.long)  # CPU: each page's window page (-1: none)
        self._fpage = self.fpage.to(device)  # its device copy, what reads index by
        self.free_window = list(range(window_pages - 1, -1, -1))
        self.window_page_bytes = 2 * bs * D * self.fk.element_size()  # one window page's K and V
        self.written: list[torch.Tensor] = []  # per layer: the pages this forward writes (CPU)
        self.leaving: list[torch.Tensor] = []  # per layer: the pages that may leave the window after it (CPU)

    def quant_tensors(self) -> list[torch.Tensor]:
        return [self.kc, self.vc, self.ks, self.kz, self.vs, self.vz, self.fk, self.fv, self._fpage]

    def nbytes(self) -> int:
        return super().nbytes() + sum(t.numel() * t.element_size() for t in self.quant_tensors())

    def kv_block_bytes(self) -> int:
        """Bytes of K and V in one block (every layer and KV head): quantized pages, the window pages not counted."""
        q = self.quant
        return self.num_layers * self.num_kv_heads * quant_page_bytes(
            block_size=self.block_size, head_dim=self.head_dim, dtype=self.dtype, bits=q.bits)

    def given_back(self, ids: torch.Tensor) -> None:
        """Pages back to the block manager's free list: their window pages go back too."""
        self._release(ids[self.fpage[ids] >= 0])

    def _release(self, ids: torch.Tensor) -> None:
        if ids.numel():
            self.free_window.extend(self.fpage[ids].tolist())
            self.fpage[ids] = -1
            self._fpage[ids.to(self._fpage.device)] = -1

    def prepare(self, tables: list[torch.Tensor], held: list[torch.Tensor], k: list[int]) -> None:
        """Before a forward: per layer, the pages it writes and those full with at least R newer pairs after it."""
        bs, R = self.block_size, self.quant.residual
        written, leaving = [], []
        for t, h, n in zip(tables, held, k, strict=True):  # t (L, H, W), h (L, H)
            j = torch.arange(t.shape[-1])
            written.append(_by_layer(t, (j >= (h // bs)[..., None]) & (j < blocks_for(h + n, bs)[..., None])))
            q0 = torch.clamp(h - R, min=0) // bs  # (L, H) pages quantized before (every older one is)
            nq = torch.clamp(h + n - R, min=0) // bs  # (L, H) pages with R newer pairs after them
            leaving.append(_by_layer(t, (j >= q0[..., None]) & (j < nq[..., None])))
        self.written = [torch.cat(w) for w in zip(*written, strict=True)]
        self.leaving = [torch.cat(x) for x in zip(*leaving, strict=True)]

    def write_pairs(self, layer: int, w: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Layer `layer`'s new pairs key/value (1, H, T, D) at flat slots w (T, H): into their pages' window pages,
        then the pages that left the window quantized (their window pages freed). A page this forward fills whole
        and that leaves the window in it (a prompt's chunk) is quantized from the new pairs, with no window page."""
        new = self.written[layer]
        new = new[self.fpage[new] < 0]
        direct = torch.isin(new, self.leaving[layer])
        self._borrow(new[~direct])
        kt, vt = key[0].transpose(0, 1).to(self.dtype), value[0].transpose(0, 1).to(self.dtype)  # (T, H, D)
        bs, D, dev = self.block_size, self.head_dim, self._fpage.device
        if not bool(direct.any()):
            dst = self._fpage[w // bs] * bs + w % bs  # (T, H) slots of the window pages
            self.fk.view(-1, D)[dst], self.fv.view(-1, D)[dst] = kt, vt
        else:
            pages = new[direct]
            self._fpage[pages.to(dev)] = -2 - torch.arange(pages.numel(), device=dev)  # -2 - its place in `k`
            d, off = self._fpage[w // bs], w % bs
            win = d >= 0
            dst = (d * bs + off)[win]
            self.fk.view(-1, D)[dst], self.fv.view(-1, D)[dst] = kt[win], vt[win]
            k = torch.empty(pages.numel() * bs, D, dtype=self.dtype, device=dev)  # a transient of the forward
            v = torch.empty_like(k)
            at = ((-2 - d) * bs + off)[~win]
            k[at], v[at] = kt[~win], vt[~win]
            self._fpage[pages.to(dev)] = -1
            self._store(pages, k.view(-1, bs, D), v.view(-1, bs, D))
        self._flush(self.leaving[layer])

    def _borrow(self, pages: torch.Tensor) -> None:
        """Window pages for these pages (CPU ids)."""
        if pages.numel() > len(self.free_window):
            raise RuntimeError(f"quantized pool: {pages.numel()} window pages asked, {len(self.free_window)} free")
        got = torch.tensor([self.free_window.pop() for _ in range(pages.numel())], dtype=torch.long)
        self.window_peak = max(self.window_peak, self.fk.shape[0] - len(self.free_window))
        self.fpage[pages] = got
        self._fpage[pages.to(self._fpage.device)] = got.to(self._fpage.device)

    def _flush(self, pages: torch.Tensor) -> None:
        """Quantize these pages' full-precision pairs (those still in the window), once."""
        pages = pages[self.fpage[pages] >= 0]
        if not pages.numel():
            return
        f = self.fpage[pages].to(self.fk.device)
        self._store(pages, self.fk[f], self.fv[f])
        self._release(pages)

    def _store(self, pages: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize the full pages' pairs k, v (n, bs, D) into pages (CPU ids)."""
        p = pages.to(self.kc.device)
        self.kc[p], ks, kz = self.key_rule.quantize(k)  # (n, bs, W), (n, 1, D) x 2
        self.ks[p], self.kz[p] = ks[:, 0], kz[:, 0]
        self.vc[p], self.vs[p], self.vz[p] = self.value_rule.quantize(v)  # (n, bs, W), (n, bs, D/G) x 2

    def pairs(self, slots: torch.Tensor, which: str = "kv"):
        """Keys and values (*slots.shape, D) of flat slots: dequantized from their page, or as held in its window
        page; the arithmetic of `Rule.dequantize` (q * s + z in float32, rounded once to the model's dtype).
        `which` "k" or "v": that one alone (the other is neither unpacked nor dequantized)."""
        bs, D = self.block_size, self.head_dim
        page, off = slots // bs, slots % bs
        fp = self._fpage[page]
        win = (fp >= 0)[..., None]
        src = fp.clamp(min=0) * bs + off
        k = torch.where(win, self.fk.view(-1, D)[src], self._keys(page, off)) if which != "v" else None
        v = torch.where(win, self.fv.view(-1, D)[src], self._values(page, off)) if which != "k" else None
        return (k, v) if which == "kv" else (k if which == "k" else v)

    def _keys(self, page: torch.Tensor, off: torch.Tensor) -> torch.Tensor:
        qk = nibbles.unpack(self.kc[page, off], self.quant.bits).float()  # (..., D)
        return qk.mul_(self.ks[page].float()).add_(self.kz[page].float()).to(self.dtype)

    def _values(self, page: torch.Tensor, off: torch.Tensor) -> torch.Tensor:
        D, G = self.head_dim, self.quant.group
        qv = nibbles.unpack(self.vc[page, off], self.quant.bits).float().unflatten(-1, (D // G, G))  # (..., D/G, G)
        v = qv.mul_(self.vs[page, off].float()[..., None]).add_(self.vz[page, off].float()[..., None])
        return v.flatten(-2).to(self.dtype)

    def as_held(self, w: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The new pairs (1, H, T, D) written at w (T, H), read back (dequantized where they left the window)."""
        k, v = self.pairs(w)  # (T, H, D)
        return k.transpose(0, 1)[None], v.transpose(0, 1)[None]

    def part_pairs(self, part, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A part's pages whole (R, H, nb * bs, D), read through `pairs`."""
        slots, _ = part.slots(layer)
        return self.pairs(slots)

    def fresh_pairs(self, part, layer: int, key, value) -> tuple[torch.Tensor, torch.Tensor]:
        """A first chunk's keys/values (1, H, T, D) as the pool holds them (quantized where they left the window)."""
        k, v = self.part_pairs(part, layer)
        T = part.fresh.stop - part.fresh.start
        return k[:, :, :T], v[:, :, :T]


def _by_layer(table: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The page ids of `table` (L, H, W) where `mask` (L, H, W), one tensor per layer."""
    return table[mask].split(mask.flatten(1).sum(1).tolist())
