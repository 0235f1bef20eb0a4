"""The paged KV pool: pages of `block_size` slots, each page owned by one (layer, KV head) of one request.

Preallocated once (no allocation while serving), on one device; `num_blocks` blocks of one page per
(layer, KV head) each, so P = num_blocks x layers x KV heads pages, any of which any (layer, KV head) may
take (a head that holds fewer pairs takes fewer pages). A flat slot is page * block_size + offset:
    k, v           (P * block_size, D)        the pairs
    pos            (P * block_size,)          source position of the pair in each slot
    sum_w, last_w  (P * block_size,)          attention statistics (scored policies only)
    k_src, rot     (P * block_size, D), (..,) re-rotation only: each key as written, and the rotary
                                              position it was written at
    own[name]      (P * block_size,)          a policy's own per-pair statistics (float32, needs.pair_state): they
                                              stay in their slot, so an evicted page takes them along
"""

from __future__ import annotations

import torch

from kvbench.serve.blocks import blocks_for


class PagedPool:
    window_peak = 0  # the most full-precision window pages in use at once (a quantized pool's: kvbench.serve.qpool)
    window_page_bytes = 0

    def __init__(self, *, num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device, track_attention,
                 rerotate: bool = False, pair_state: tuple[str, ...] = (), kv: bool = True):
        """kv: allocate K/V in the model's dtype (False: a subclass stores them, kvbench.serve.qpool)."""
        self.block_size, self.num_blocks = block_size, num_blocks
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.num_pages = num_blocks * num_layers * num_kv_heads
        S = self.num_pages * block_size
        self.k = torch.zeros(S, head_dim, dtype=dtype, device=device) if kv else None
        self.v = torch.zeros_like(self.k) if kv else None
        self.pos = torch.zeros(S, dtype=torch.long, device=device)
        self.track = track_attention
        self.sum_w = torch.zeros(S, dtype=torch.float32, device=device) if track_attention else None
        self.last_w = torch.zeros_like(self.sum_w) if track_attention else None
        self.k_src = torch.zeros(S, head_dim, dtype=dtype, device=device) if rerotate else None
        self.rot = torch.zeros(S, dtype=torch.long, device=device) if rerotate else None
        self.own = {n: torch.zeros(S, dtype=torch.float32, device=device) for n in pair_state}

    @staticmethod
    def block_bytes(*, num_layers, block_size, num_kv_heads, head_dim, dtype, track_attention, rerotate=False,
                    own: int = 0) -> int:
        """Bytes of one block (one page in every layer and KV head): K, V, positions, statistics,
        re-rotation's written keys and positions, and `own` float32 per-pair statistics of the policy's."""
        el = torch.empty((), dtype=dtype).element_size()
        slots = num_layers * num_kv_heads * block_size
        b = (3 if rerotate else 2) * slots * head_dim * el + 8 * slots * (2 if rerotate else 1)
        return b + (2 * 4 * slots if track_attention else 0) + 4 * slots * own

    def kv_block_bytes(self) -> int:
        """Bytes of K and V in one block (every layer and KV head)."""
        return 2 * self.num_layers * self.num_kv_heads * self.block_size * self.head_dim * self.k.element_size()

    def nbytes(self) -> int:
        ts = [t for t in (self.k, self.v) if t is not None] + [self.pos] + ([self.sum_w, self.last_w] if self.track else [])
        ts += ([self.k_src, self.rot] if self.k_src is not None else []) + list(self.own.values())
        return sum(t.numel() * t.element_size() for t in ts)

    def slots(self, pages: torch.Tensor, held: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """((L, H, N) flat slots of each (layer, KV head)'s held pairs in logical order, (L, H, N) bool: held),
        N the most any holds; slots past a head's count repeat its first (masked by the second)."""
        bs = self.block_size
        N = int(held.max())
        s = torch.arange(N)
        valid = s < held[..., None]  # (L, H, N)
        page = pages[..., : blocks_for(N, bs)].gather(-1, (s // bs).expand(*held.shape, N))
        slots = page * bs + s % bs
        return torch.where(valid, slots, slots[..., :1]), valid

    def prepare(self, tables: list[torch.Tensor], held: list[torch.Tensor], k: list[int]) -> None:
        """Before a forward (each request's tables, counts and tokens fed): nothing to do here."""

    def given_back(self, ids: torch.Tensor) -> None:
        """Pages given back to the block manager's free list: nothing to do here."""

    def write_pairs(self, layer: int, w: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Layer `layer`'s new pairs key/value (1, H, T, D) into their flat slots w (T, H)."""
        self.k[w] = key[0].transpose(0, 1).to(self.k.dtype)  # (T, H, D)
        self.v[w] = value[0].transpose(0, 1).to(self.v.dtype)
        if self.k_src is not None:  # re-rotation's source: the keys as written
            self.k_src[w] = self.k[w]

    def as_held(self, w: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The new pairs (1, H, T, D) written at w (T, H) as the pool holds them: as computed."""
        return key, value

    def pairs(self, slots: torch.Tensor, which: str = "kv"):
        """Keys and values (*slots.shape, D) held at flat slots; `which` "k" or "v": that one alone."""
        return self.k[slots] if which == "k" else self.v[slots] if which == "v" else (self.k[slots], self.v[slots])

    def part_pairs(self, part, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A part's pages whole (R, H, nb * bs, D), one index per page."""
        D, bs = self.head_dim, self.block_size
        b = part.blocks[layer]  # (R, H, nb)
        k = self.k.view(-1, bs, D).index_select(0, b.flatten()).view(*b.shape[:2], -1, D)
        return k, self.v.view(-1, bs, D).index_select(0, b.flatten()).view(*b.shape[:2], -1, D)

    def fresh_pairs(self, part, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A first chunk's keys/values (1, H, T, D): the forward's own new ones, nothing to gather."""
        return key[:, :, part.fresh], value[:, :, part.fresh]
