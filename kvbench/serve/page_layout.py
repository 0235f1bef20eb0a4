"""The layout of one forward over the paged pool: which slots each token writes and reads, per layer.

A forward packs every scheduled request's tokens into one row (1, T) (prefill chunks and decode rows
alike), so the model's linear layers see only real tokens. `Layout.build` turns the block tables (one per
(layer, KV head) of each request) into index tensors once per forward: where each new token is written in
each (layer, KV head), its positions, and the attention `Part`s. Attention's cost follows the real
(query, key) pairs: every request with a prefill chunk is a part of its own (its queries against its own
pages), and the decode rows (one query each) are grouped by how many blocks they read, a group closing when
padding its rows to its longest would add more than DECODE_PAD of work, so no decode row is padded to a
chunk's width and no key to a much longer request's. A part reads its rows' pages whole (one index per
page); keys past a (row, head)'s count are masked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvbench.serve.blocks import blocks_for

DECODE_PAD = 0.25  # a decode group's padded key work over its real work, at most 1 + this


def right_aligned(r: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(real, j), both (R, width): whether each column holds one of row b's r_b new tokens (the last r_b
    columns), and the token's index among them (negative for pads)."""
    j = torch.arange(width)[None, :] - (width - r.to(torch.long))[:, None]
    return j >= 0, j


@dataclass
class View:
    """What kvbench.attention's kernels read from a static `Step`, for one layer of a part."""

    mask: torch.Tensor | None  # (R_p, 1 or H, K_q, N) bool: query sees key; None when every query sees every key
    causal: bool
    real: torch.Tensor
    all_real: bool


@dataclass
class Part:
    """Some rows of a forward whose attention is one call per layer: their queries against their own pages.

    Shapes for R_p rows, K_q query columns (right-aligned, pads left), nb pages per (row, head), N = nb x
    block_size keys; leading L: one entry per layer (each (layer, KV head) has its own pages).
    """

    q_index: torch.Tensor  # (R_p, K_q) packed index of each query (0 for pads)
    real: torch.Tensor  # (R_p, K_q) bool
    blocks: torch.Tensor  # (L, R_p, H, nb) page ids (page 0 past a head's table)
    n_before: torch.Tensor  # (L, R_p, H) keys each (row, head) held before this forward
    n_after: torch.Tensor  # (L, R_p, H) keys each holds after it
    out: torch.Tensor  # (real queries,) their packed indices, in (row, column) order
    all_real: bool
    uniform: bool  # every (layer, head) of a row holds the same count: one mask for every layer
    block_size: int
    causal: bool = False  # one row whose keys are exactly this chunk's (a first chunk): causal, no mask
    fresh: slice | None = None  # then its keys are the forward's own new keys [fresh]: nothing to gather
    mask: torch.Tensor | None = None  # uniform: (R_p, 1, K_q, N) bool, shared by every layer
    bias: torch.Tensor | None = None  # uniform: the mask as SDPA's additive float mask, made once for all layers
    _j: torch.Tensor | None = None  # (R_p, K_q) index of each query among its row's new tokens

    @property
    def rows(self) -> int:
        return self.q_index.shape[0]

    @property
    def keys(self) -> int:
        return self.blocks.shape[-1] * self.block_size

    def at(self, layer: int) -> View:
        """The part's mask for one layer (built there when heads hold different counts)."""
        if self.uniform or self.fresh is not None:
            return View(self.mask, self.causal, self.real, self.all_real)
        s = torch.arange(self.keys, device=self.real.device)
        seen = self.n_before[layer][:, :, None] + self._j[:, None, :]  # (R, H, K_q): the last slot each sees
        mask = s <= seen[..., None]  # (R, H, K_q, N), compared straight into bools
        mask &= self.real[:, None, :, None]
        mask[..., 0] |= ~self.real[:, None, :]  # pad rows see slot 0 (never an empty softmax row; discarded)
        return View(mask, False, self.real, self.all_real)

    def additive(self, view: View, dtype: torch.dtype) -> torch.Tensor | None:
        """The view's mask as 0 / -inf in `dtype` (uniform: built at the first layer, reused by the others)."""
        if view.mask is None:
            return None
        if self.uniform and self.bias is not None:
            return self.bias
        bias = torch.full(view.mask.shape, float("-inf"), dtype=dtype, device=view.mask.device).masked_fill_(view.mask, 0.0)
        if self.uniform:
            self.bias = bias
        return bias

    def slots(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """((R, H, N) flat slot of each key of this layer, (R, H, N) bool: a key the (row, head) holds)."""
        bs = self.block_size
        b = self.blocks[layer]
        slots = (b[..., None] * bs + torch.arange(bs, device=b.device)).flatten(-2)
        return slots, torch.arange(self.keys, device=b.device) < self.n_after[layer][..., None]


@dataclass
class Layout:
    write: torch.Tensor  # (L, T, H) flat slot each packed token is written to, per layer and KV head
    positions: torch.Tensor  # (1, T) the model's position ids: source positions, or slots with re-rotation
    source: torch.Tensor  # (T,) source positions (what pool.pos keeps, what policies score by)
    last: torch.Tensor  # (R,) packed index of each request's last token in this forward
    parts: list[Part] = field(default_factory=list)

    @classmethod
    def build(cls, block_size: int, tables: list[torch.Tensor], held: list[torch.Tensor], k: list[int],
              start: list[int], device, rotary: bool = False):
        """tables: each request's (L, H, W) pages; held: its (L, H) pairs before the write; k: tokens fed;
        start: their first source position; rotary: the model's positions are the slots (re-rotation)."""
        bs = block_size
        k_t = torch.tensor(k)
        offset = torch.cumsum(k_t, 0) - k_t  # packed start of each request
        src = torch.cat([torch.arange(a, a + n) for a, n in zip(start, k, strict=True)])
        writes = []
        for t, h, n in zip(tables, held, k, strict=True):
            logical = h[..., None] + torch.arange(n)  # (L, H, n)
            writes.append(t.gather(-1, logical // bs) * bs + logical % bs)
        write = torch.cat(writes, dim=-1).transpose(1, 2)  # (L, T, H)
        width = max(t.shape[-1] for t in tables)
        table = torch.stack([torch.nn.functional.pad(t, (0, width - t.shape[-1])) for t in tables], 1)  # (L, R, H, W)
        nb_t = torch.stack(held, 1)  # (L, R, H)
        parts = [_part(table[:, [r]], nb_t[:, [r]], k_t[[r]], offset[[r]], bs, device) for r in range(len(k)) if k[r] > 1]
        decode = [r for r in range(len(k)) if k[r] == 1]
        reads = [int(blocks_for(held[r] + 1, bs).max()) for r in decode]
        for group in _decode_groups(decode, reads):
            idx = torch.tensor(group)
            parts.append(_part(table[:, idx], nb_t[:, idx], k_t[idx], offset[idx], bs, device))
        positions = torch.cat([int(h[0, 0]) + torch.arange(n) for h, n in zip(held, k, strict=True)]) if rotary else src
        return cls(write=write.to(device), positions=positions[None].to(device), source=src.to(device),
                   last=(offset + k_t - 1).to(device), parts=parts)


def _decode_groups(rows: list[int], blocks: list[int]) -> list[list[int]]:
    """Decode rows grouped by the blocks they read (fewest first); a group closes when padding it to its
    longest row would cost more than DECODE_PAD over its real work."""
    order = sorted(range(len(rows)), key=lambda i: blocks[i])
    groups, cur, real = [], [], 0
    for i in order:
        if cur and (len(cur) + 1) * blocks[i] > (1 + DECODE_PAD) * (real + blocks[i]):
            groups.append(cur)
            cur, real = [], 0
        cur.append(rows[i])
        real += blocks[i]
    return groups + ([cur] if cur else [])


def _part(table: torch.Tensor, n_before: torch.Tensor, k: torch.Tensor, offset: torch.Tensor, bs: int, device) -> Part:
    """One attention call's index tensors for these rows (tables (L, R_p, H, W), counts (L, R_p, H), offsets)."""
    R, Kq = len(k), int(k.max())
    n_after = n_before + k[None, :, None]
    nb = int(blocks_for(n_after.max(), bs))
    uniform = bool((n_before == n_before[:1, :, :1]).all())
    real, j = right_aligned(k, Kq)
    q_index = torch.where(real, offset[:, None] + j, torch.zeros_like(j))
    fresh, mask = None, None
    if R == 1 and not bool(n_before.any()):  # a first chunk: its keys are the new ones, in order, causal
        fresh = slice(int(offset[0]), int(offset[0] + k[0]))
    elif uniform and not (bool((n_after == nb * bs).all()) and Kq == 1):  # else nothing to hide
        s = torch.arange(nb * bs)
        seen = n_before[0, :, 0, None] + j  # (R, K_q): the last slot each query may see (its own pair)
        mask = s[None, None, :] <= seen[:, :, None]  # (R, K_q, N) bool, no integer (R, K_q, N) tensor
        mask &= real[:, :, None]
        mask[:, :, 0] |= ~real  # pad rows see slot 0 (never an empty softmax row; discarded)
        mask = mask[:, None].to(device)
    return Part(q_index=q_index.to(device), real=real.to(device), blocks=table[..., :nb].to(device),
                n_before=n_before.to(device), n_after=n_after.to(device), out=q_index[real].to(device),
                all_real=bool(real.all()), uniform=uniform, block_size=bs, causal=fresh is not None and Kq > 1,
                fresh=fresh, mask=mask, _j=j.to(device))
