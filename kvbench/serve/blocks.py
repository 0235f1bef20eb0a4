"""The block manager: a free list of physical block ids and who owns each; nothing else.

It never decides anything (the scheduler does) and never touches tensors (the pool does). Blocks
return to the free list the moment their request finishes, is preempted or evicts them.
"""

from __future__ import annotations

from kvbench.serve.request import Request


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_ids: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, ... first
        self.owner: dict[int, int] = {}  # block id -> request id

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_ids)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self.free_ids)

    def allocate(self, req: Request, n: int) -> None:
        """Append n free blocks to the request's table."""
        if n > len(self.free_ids):
            raise RuntimeError(f"block manager: {n} blocks asked, {len(self.free_ids)} free")
        for _ in range(n):
            b = self.free_ids.pop()
            self.owner[b] = req.rid
            req.blocks.append(b)

    def free_logical(self, req: Request, logical: list[int]) -> None:
        """Give back the request's blocks at these logical indices (eviction); the table closes up."""
        drop = set(logical)
        for i in sorted(drop, reverse=True):
            b = req.blocks[i]
            del self.owner[b]
            self.free_ids.append(b)
        req.blocks = [b for i, b in enumerate(req.blocks) if i not in drop]

    def free(self, req: Request) -> None:
        """Give back every block of the request (finished or preempted)."""
        self.free_logical(req, list(range(len(req.blocks))))
