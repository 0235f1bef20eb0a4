"""Block-granular eviction (OpenVINO GenAI's areas, with kvbench's eviction during prefill).

A request's held slots split into a start area (the first `ceil(protect_first / block_size)`
blocks), an evictable area, and a recent area (the last `protect_recent` slots plus the partly
filled last block). Only whole, full blocks of the evictable area are evicted. Before a forward
that would take a request over `policy.kv_size` slots, the scheduler asks for the fewest blocks
that keep it within budget (`BlockRule`) and `choose_blocks` picks the lowest-scored ones: the
policy's own `score()` on its pairs (no copy of any policy), aggregated per block over layers, KV
heads and the block's slots, as a sum or as NORM_SUM (each pair's score divided by its lifetime in
the cache, OpenVINO's default). `full` never evicts; `window` (score = position) drops the oldest
evictable block. A block is evicted from every layer and KV head at once (one block table per
request), so a request's pool share is exact in blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.policies.base import Policy, ScoreStats

BLOCK_SCORES = ("sum", "norm_sum")


@dataclass(frozen=True)
class BlockRule:
    """How many slots a request may hold and which of its blocks may go (counts only)."""

    block_size: int
    kv_size: int | None = None  # None: never evict
    start_blocks: int = 0
    recent: int = 0  # slots
    in_prefill: bool = True  # evict while the prompt is being computed (prefill_and_decode)

    @classmethod
    def of(cls, policy: Policy, block_size: int) -> BlockRule:
        if not policy.evicts:
            return cls(block_size)
        return cls(
            block_size=block_size,
            kv_size=policy.kv_size,
            start_blocks=-(-policy.protect_first // block_size),
            recent=policy.protect_recent or 0,
            in_prefill=policy.evicts_in_prefill,
        )

    def min_kv_size(self) -> int:
        """The smallest kv_size that always leaves room for one new token after evicting."""
        return self.start_blocks * self.block_size + self.recent + self.block_size

    def applies(self, n_computed: int, prompt_len: int) -> bool:
        return self.kv_size is not None and (self.in_prefill or n_computed >= prompt_len)

    def evictable(self, n_slots: int) -> range:
        """Logical block indices of the evictable area for a request holding n_slots."""
        end = (n_slots - self.recent) // self.block_size  # full blocks entirely older than the recent area
        return range(self.start_blocks, max(self.start_blocks, end))

    def plan(self, n_slots: int, k: int) -> tuple[int, int]:
        """(tokens it may feed, blocks to evict first) for a request holding n_slots that wants k."""
        assert self.kv_size is not None
        floor = n_slots - len(self.evictable(n_slots)) * self.block_size
        k = max(0, min(k, self.kv_size - floor))
        over = n_slots + k - self.kv_size
        return k, max(0, -(-over // self.block_size))


def block_scores(policy: Policy, stats: ScoreStats, block_size: int, mode: str = "sum") -> torch.Tensor:
    """(n_blocks,) score of each full block from the policy's pair scores (stats of one request, N slots)."""
    s = policy.score(stats).float()  # (L, 1, H, N)
    s = s.expand(stats.pos.shape)
    if mode == "norm_sum":
        life = (stats.last + 1 - stats.pos).clamp(min=1).float()
        s = s / life
    per_slot = s.sum(dim=(0, 1, 2))  # (N,)
    nb = per_slot.shape[0] // block_size
    return per_slot[: nb * block_size].view(nb, block_size).sum(-1)


def choose_blocks(scores: torch.Tensor, candidates: range, n: int) -> list[int]:
    """The n lowest-scored candidate blocks; on equal scores the older block goes first."""
    idx = torch.tensor(list(candidates), dtype=torch.long)
    order = torch.sort(scores[idx], stable=True).indices[:n]
    return sorted(idx[order].tolist())


def oldest_blocks(candidates: range, n: int) -> list[int]:
    return list(candidates)[:n]
