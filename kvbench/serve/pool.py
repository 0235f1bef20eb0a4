"""The paged KV pool and the layout of one forward over it.

Pool, preallocated once (no allocation while serving), one device:
    k, v           (L, num_blocks * block_size, H_kv, D)   flat slot = block * block_size + offset
    pos            (num_blocks * block_size,)               source position of the pair in each slot
    sum_w, last_w  (L, num_blocks * block_size, H_kv)       attention statistics (scored policies only)

A forward packs every scheduled request's tokens into one row (1, T) (prefill chunks and decode
rows alike). `Layout.build` turns the block tables into index tensors once per forward, shared
by all layers: where each new token is written, which slots each request reads, and the mask.
Queries are laid out per request right-aligned in (R, Kmax) so the newest query is the last row
(`attention_stats`' w_last), keys in (R, Nmax) in logical slot order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.cache.plan import right_aligned


class PagedPool:
    def __init__(self, *, num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device, track_attention):
        S = num_blocks * block_size
        self.block_size, self.num_blocks = block_size, num_blocks
        self.k = torch.zeros(num_layers, S, num_kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.pos = torch.zeros(S, dtype=torch.long, device=device)
        self.track = track_attention
        self.sum_w = torch.zeros(num_layers, S, num_kv_heads, dtype=torch.float32, device=device) if track_attention else None
        self.last_w = torch.zeros_like(self.sum_w) if track_attention else None

    @staticmethod
    def block_bytes(*, num_layers, block_size, num_kv_heads, head_dim, dtype, track_attention) -> int:
        """Bytes of one block across layers: K, V, its positions and statistics."""
        el = torch.empty((), dtype=dtype).element_size()
        b = 2 * num_layers * block_size * num_kv_heads * head_dim * el + 8 * block_size
        return b + (2 * num_layers * block_size * num_kv_heads * 4 if track_attention else 0)

    def nbytes(self) -> int:
        ts = [self.k, self.v, self.pos] + ([self.sum_w, self.last_w] if self.track else [])
        return sum(t.numel() * t.element_size() for t in ts)

    def slots(self, blocks: list[int], n: int) -> torch.Tensor:
        """(n,) flat slots of a request's first n logical slots."""
        bs = self.block_size
        s = torch.arange(n)
        return torch.tensor(blocks, dtype=torch.long)[s // bs] * bs + s % bs


@dataclass
class Layout:
    write: torch.Tensor  # (T,) flat slot each packed token is written to
    positions: torch.Tensor  # (1, T) true positions
    gather: torch.Tensor  # (R, Nmax) flat slots each request reads (0 past its count)
    key_valid: torch.Tensor  # (R, Nmax) bool
    q_index: torch.Tensor  # (R, Kmax) packed index of each query (right-aligned; 0 for pads)
    real: torch.Tensor  # (R, Kmax) bool: a real query
    mask: torch.Tensor  # (R, 1, Kmax, Nmax) bool: query sees key
    last: torch.Tensor  # (R,) packed index of each request's last token in this forward
    all_real: bool
    causal: bool = False  # for attention_stats' step interface

    @classmethod
    def build(cls, pool: PagedPool, tables: list[list[int]], n_before: list[int], k: list[int], start: list[int], device):
        """tables: block tables; n_before: slots held before the write; k: tokens fed; start: their first position."""
        bs = pool.block_size
        R, Kmax = len(k), max(k)
        n_after = [a + b for a, b in zip(n_before, k, strict=True)]
        Nmax = max(n_after)
        nb = max(len(t) for t in tables)
        table = torch.zeros(R, nb, dtype=torch.long)
        for r, t in enumerate(tables):
            table[r, : len(t)] = torch.tensor(t, dtype=torch.long)
        nb_t, k_t, na_t = torch.tensor(n_before), torch.tensor(k), torch.tensor(n_after)
        s = torch.arange(Nmax)
        key_valid = s[None, :] < na_t[:, None]  # (R, Nmax)
        flat = table.gather(1, (s // bs)[None, :].clamp(max=nb - 1).expand(R, -1)) * bs + s % bs
        gather = torch.where(key_valid, flat, torch.zeros_like(flat))
        offset = torch.cumsum(k_t, 0) - k_t  # packed start of each request
        real, j = right_aligned(k_t, Kmax)  # index among the request's new tokens, as the static cache lays them
        q_index = torch.where(real, offset[:, None] + j, torch.zeros_like(j))
        wslot = nb_t[:, None] + j  # logical slot of each query's own pair
        mask = (s[None, None, :] <= wslot[:, :, None]) & key_valid[:, None, :] & real[:, :, None]
        mask[:, :, 0] |= ~real  # pad rows see slot 0 (never an empty softmax row; discarded)
        write = flat.gather(1, wslot.clamp(min=0))[real]  # (T,) in packed order
        positions = torch.cat([torch.arange(a, a + n) for a, n in zip(start, k, strict=True)])
        return cls(
            write=write.to(device),
            positions=positions[None].to(device),
            gather=gather.to(device),
            key_valid=key_valid.to(device),
            q_index=q_index.to(device),
            real=real.to(device),
            mask=mask[:, None].to(device),
            last=(offset + k_t - 1).to(device),
            all_real=bool(real.all()),
        )
