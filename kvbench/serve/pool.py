"""The paged KV pool and the layout of one forward over it.

Pool, preallocated once (no allocation while serving), one device; a flat slot is block * block_size +
offset, so the memory is also (L, num_blocks, block_size, H_kv, D), block-major:
    k, v           (L, num_blocks * block_size, H_kv, D)
    pos            (num_blocks * block_size,)               source position of the pair in each slot
    sum_w, last_w  (L, num_blocks * block_size, H_kv)       attention statistics (scored policies only)
    k_src, rot     (L, S, H_kv, D), (S,)                    re-rotation only: each key as written, and
                                                            the rotary position it was written at

A forward packs every scheduled request's tokens into one row (1, T) (prefill chunks and decode rows
alike), so the model's linear layers see only real tokens. `Layout.build` turns the block tables into
index tensors once per forward, shared by all layers: where each new token is written, its positions, and
the attention `Part`s. Attention's cost follows the real (query, key) pairs: every request with a prefill
chunk is a part of its own (its queries against its own pages), and the decode rows (one query each) are
grouped by how many blocks they read, a group closing when padding its rows to its longest would add
more than DECODE_PAD of work, so no decode row is padded to a chunk's width and no key to a much longer
request's. A part reads its rows' pages whole (`blocks`: one index per block, not per slot, so the copy
moves block_size x H_kv x D contiguous elements at a time); keys past a row's count are masked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvbench.cache.layout import right_aligned

DECODE_PAD = 0.25  # a decode group's padded key work over its real work, at most 1 + this


class PagedPool:
    def __init__(self, *, num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device, track_attention,
                 rerotate: bool = False):
        S = num_blocks * block_size
        self.block_size, self.num_blocks = block_size, num_blocks
        self.k = torch.zeros(num_layers, S, num_kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.pos = torch.zeros(S, dtype=torch.long, device=device)
        self.track = track_attention
        self.sum_w = torch.zeros(num_layers, S, num_kv_heads, dtype=torch.float32, device=device) if track_attention else None
        self.last_w = torch.zeros_like(self.sum_w) if track_attention else None
        self.k_src = torch.zeros_like(self.k) if rerotate else None
        self.rot = torch.zeros(S, dtype=torch.long, device=device) if rerotate else None

    @staticmethod
    def block_bytes(*, num_layers, block_size, num_kv_heads, head_dim, dtype, track_attention, rerotate=False) -> int:
        """Bytes of one block across layers: K, V, its positions, statistics and re-rotation's written keys."""
        el = torch.empty((), dtype=dtype).element_size()
        key = num_layers * block_size * num_kv_heads * head_dim * el
        b = (3 if rerotate else 2) * key + 8 * block_size + (8 * block_size if rerotate else 0)
        return b + (2 * num_layers * block_size * num_kv_heads * 4 if track_attention else 0)

    def nbytes(self) -> int:
        ts = [self.k, self.v, self.pos] + ([self.sum_w, self.last_w] if self.track else [])
        ts += [self.k_src, self.rot] if self.k_src is not None else []
        return sum(t.numel() * t.element_size() for t in ts)

    def slots(self, blocks: list[int], n: int) -> torch.Tensor:
        """(n,) flat slots of a request's first n logical slots."""
        bs = self.block_size
        s = torch.arange(n)
        return torch.tensor(blocks, dtype=torch.long)[s // bs] * bs + s % bs


@dataclass
class Part:
    """Some rows of a forward whose attention is one call: their queries against their own pages.

    Shapes for R_p rows, K_q query columns (right-aligned, pads left), N = nb x block_size keys.
    It has the fields kvbench.attention reads from a static `Step` (mask, causal, real, all_real).
    """

    q_index: torch.Tensor  # (R_p, K_q) packed index of each query (0 for pads)
    real: torch.Tensor  # (R_p, K_q) bool
    blocks: torch.Tensor  # (R_p * nb,) block ids, row after row (block 0 past a row's table)
    table: torch.Tensor  # (R_p, nb) int32, the same, for a paged kernel (flash-attn's block_table)
    n_after: torch.Tensor  # (R_p,) keys each row holds after this forward (flash-attn's cache_seqlens)
    slots: torch.Tensor  # (R_p, N) flat slot of each key
    key_valid: torch.Tensor  # (R_p, N) bool: a key the row holds
    mask: torch.Tensor | None  # (R_p, 1, K_q, N) bool: query sees key; None when every query sees every key
    out: torch.Tensor  # (real queries,) their packed indices, in (row, column) order
    all_real: bool
    causal: bool = False  # one row whose keys are exactly this chunk's (a first chunk): causal, no mask
    fresh: slice | None = None  # then its keys are the forward's own new keys [fresh]: nothing to gather
    bias: torch.Tensor | None = None  # the mask as SDPA's additive float mask, made once for all layers

    def additive(self, dtype: torch.dtype) -> torch.Tensor | None:
        """`mask` as 0 / -inf in `dtype`, built at the first layer and reused by the others."""
        if self.mask is not None and self.bias is None:
            self.bias = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device).masked_fill_(
                ~self.mask, float("-inf"))
        return self.bias

    @property
    def rows(self) -> int:
        return self.q_index.shape[0]


@dataclass
class Layout:
    write: torch.Tensor  # (T,) flat slot each packed token is written to
    positions: torch.Tensor  # (1, T) the model's position ids: source positions, or slots with re-rotation
    source: torch.Tensor  # (T,) source positions (what pool.pos keeps, what policies score by)
    last: torch.Tensor  # (R,) packed index of each request's last token in this forward
    parts: list[Part] = field(default_factory=list)
    attention: str = "paged_sdpa"  # how the parts attend (kvbench.serve.attention.backend)

    @classmethod
    def build(cls, pool: PagedPool, tables: list[list[int]], n_before: list[int], k: list[int], start: list[int],
              device, rotary: bool = False):
        """tables: block tables; n_before: slots held before the write; k: tokens fed; start: their first source
        position; rotary: the model's positions are the slots (re-rotation) rather than the source positions."""
        bs = pool.block_size
        k_t, nb_t = torch.tensor(k), torch.tensor(n_before)
        offset = torch.cumsum(k_t, 0) - k_t  # packed start of each request
        src = torch.cat([torch.arange(a, a + n) for a, n in zip(start, k, strict=True)])
        logical = torch.cat([torch.arange(a, a + n) for a, n in zip(n_before, k, strict=True)])  # each token's slot
        row_of = torch.repeat_interleave(torch.arange(len(k)), k_t)
        width = max(len(t) for t in tables)
        table = torch.zeros(len(tables), width, dtype=torch.long)
        for r, t in enumerate(tables):
            table[r, : len(t)] = torch.tensor(t, dtype=torch.long)
        write = table[row_of, logical // bs] * bs + logical % bs
        parts = [_part(table[[r]], nb_t[[r]], k_t[[r]], offset[[r]], bs, device)
                 for r in range(len(k)) if k[r] > 1]
        decode = [r for r in range(len(k)) if k[r] == 1]
        for group in _decode_groups(decode, [(n_before[r] + 1 + bs - 1) // bs for r in decode]):
            idx = torch.tensor(group)
            parts.append(_part(table[idx], nb_t[idx], k_t[idx], offset[idx], bs, device))
        return cls(write=write.to(device), positions=(logical if rotary else src)[None].to(device),
                   source=src.to(device), last=(offset + k_t - 1).to(device), parts=parts)


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
    """One attention call's index tensors for these rows (their tables (R_p, width), counts and packed offsets)."""
    R, Kq = len(k), int(k.max())
    n_after = n_before + k
    nb = int((n_after.max() + bs - 1) // bs)
    tab = table[:, :nb]
    s = torch.arange(nb * bs)
    key_valid = s[None, :] < n_after[:, None]  # (R, N)
    slots = tab.gather(1, (s // bs)[None, :].expand(R, -1)) * bs + s % bs
    real, j = right_aligned(k, Kq)
    q_index = torch.where(real, offset[:, None] + j, torch.zeros_like(j))
    seen = n_before[:, None] + j  # the last slot each query may see (its own pair)
    fresh = None
    if R == 1 and int(n_before[0]) == 0:  # a first chunk: its keys are the new ones, in order, causal
        mask, fresh = None, slice(int(offset[0]), int(offset[0] + k[0]))
    elif bool((n_after == nb * bs).all()) and Kq == 1:
        mask = None  # one query per row and every row's keys are whole: nothing to hide
    else:
        mask = (s[None, None, :] <= seen[:, :, None]) & real[:, :, None]
        mask[:, :, 0] |= ~real  # pad rows see slot 0 (never an empty softmax row; discarded)
        mask = mask[:, None].to(device)
    return Part(q_index=q_index.to(device), real=real.to(device), blocks=tab.reshape(-1).to(device),
                table=tab.to(torch.int32).to(device), n_after=n_after.to(torch.int32).to(device),
                slots=slots.to(device), key_valid=key_valid.to(device), mask=mask,
                out=q_index[real].to(device), all_real=bool(real.all()), causal=fresh is not None and Kq > 1,
                fresh=fresh)
