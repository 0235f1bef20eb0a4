"""The block manager: a free list of page ids, and the block tables it grows, shrinks and frees; nothing else.

A page is `block_size` slots of one (layer, KV head); a block is one page in every layer and KV head (what
`serve.num_blocks` counts), so the pool has `num_blocks x layers x KV heads` pages. Owning pages per
(layer, KV head) lets a head that holds fewer pairs hold fewer pages: memory is freed head by head.
The manager never decides anything (the scheduler does) and never touches KV tensors (the pool does).
Pages return to the free list the moment their request finishes, is preempted or evicts them.
"""

from __future__ import annotations

import torch

from kvbench.serve.request import Request


def blocks_for(tokens, block_size: int):
    """Blocks (pages) that hold `tokens` slots: an int, or a tensor elementwise."""
    return -(-tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, shape: tuple[int, int] = (1, 1)):
        """shape: (layers, KV heads) of the block tables; the pool holds num_blocks pages in each."""
        self.num_blocks, self.block_size, self.shape = num_blocks, block_size, shape
        self.pages_per_block = shape[0] * shape[1]
        self.num_pages = num_blocks * self.pages_per_block
        self.free_ids: list[int] = list(range(self.num_pages - 1, -1, -1))  # pop() hands out 0, 1, ... first
        self.on_give = None  # called with the page ids given back (a quantized pool frees their window pages)

    @property
    def num_free(self) -> int:
        """Free pages."""
        return len(self.free_ids)

    @property
    def num_used(self) -> int:
        """Pages in use."""
        return self.num_pages - len(self.free_ids)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self.free_ids)

    def _take(self, n: int) -> torch.Tensor:
        if n > len(self.free_ids):
            raise RuntimeError(f"block manager: {n} pages asked, {len(self.free_ids)} free")
        ids = self.free_ids[len(self.free_ids) - n:][::-1]
        del self.free_ids[len(self.free_ids) - n:]
        return torch.tensor(ids, dtype=torch.long)

    def _give(self, ids: torch.Tensor) -> None:
        self.free_ids.extend(ids.flip(0).tolist())
        if self.on_give is not None:
            self.on_give(ids)

    def admit(self, req: Request) -> None:
        """Empty tables for a request that starts (or starts again after a preemption)."""
        L, H = self.shape
        req.pages = torch.zeros(L, H, 0, dtype=torch.long)
        req.held = torch.zeros(L, H, dtype=torch.long)
        req.compressed = False

    def need(self, req: Request, k: int) -> int:
        """Pages a chunk of k new tokens takes (every (layer, KV head) writes them)."""
        bs = self.block_size
        held = req.held if req.held is not None else torch.zeros(self.shape, dtype=torch.long)
        return int((blocks_for(held + k, bs) - blocks_for(held, bs)).sum())

    def grow(self, req: Request, k: int) -> None:
        """Append to each table the pages its next k slots need."""
        bs = self.block_size
        nb0, nb1 = blocks_for(req.held, bs), blocks_for(req.held + k, bs)  # (L, H)
        ids = self._take(int((nb1 - nb0).sum()))
        width = int(nb1.max()) if nb1.numel() else 0
        if req.pages.shape[-1] < width:
            pad = torch.zeros(*req.pages.shape[:2], width - req.pages.shape[-1], dtype=torch.long)
            req.pages = torch.cat([req.pages, pad], dim=-1)
        j = torch.arange(req.pages.shape[-1])
        new = (j >= nb0[..., None]) & (j < nb1[..., None])  # (L, H, W), row-major like the ids
        req.pages[new] = ids

    def advance(self, req: Request, k: int) -> None:
        """k tokens were written in every (layer, KV head)."""
        req.held += k

    def evict(self, req: Request, which: torch.Tensor) -> None:
        """Give back the pages at these logical blocks ((L, H, W) bool, full blocks only); the tables close up."""
        W = req.pages.shape[-1]
        which = torch.nn.functional.pad(which, (0, max(0, W - which.shape[-1])))[..., :W]
        self._give(req.pages[which])
        order = torch.sort(which.to(torch.int8), dim=-1, stable=True).indices  # kept ones first, in order
        req.pages = req.pages.gather(-1, order)
        req.held -= which.sum(-1) * self.block_size

    def free(self, req: Request) -> None:
        """Give back every page of the request (finished or preempted)."""
        if req.pages is None:
            return
        j = torch.arange(req.pages.shape[-1])
        self._give(req.pages[j < blocks_for(req.held, self.block_size)[..., None]])
        req.pages, req.held = None, None
