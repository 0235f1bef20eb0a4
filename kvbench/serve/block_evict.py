"""Block-granular eviction (OpenVINO GenAI's areas, with kvbench's eviction during prefill), per (layer, KV head).

A request's held slots in one (layer, KV head) split into a start area (the first
`ceil(protect_first / block_size)` blocks), an evictable area, and a recent area (its `recent` newest
slots plus the partly filled last block). Only whole, full blocks of the evictable area are evicted.
Before a forward that would take a (layer, KV head) over its budget, the scheduler asks for the fewest
blocks that keep it within (`BlockRule.plan`, vectorised over layers and heads), and `choose` picks the
lowest-scored ones: the policy's own `score()` on its pairs (no copy of any policy), aggregated per block
over the block's slots, as a sum or as NORM_SUM (each pair's score divided by its lifetime in the cache,
OpenVINO's default).

Scope: under one budget per request (kv_size, or a per-prompt budget, with a schedule that evicts as a
request grows) a block's score is also summed over layers and KV heads and the same blocks go from every
(layer, KV head) (`request` scope, as OpenVINO). With budgets that differ by layer or KV head, or
schedule=after_prefill (one compression, as the static engine: per head), each (layer, KV head) scores
and evicts its own blocks (`head` scope). `full` never evicts; `window` (score = position) drops the
oldest evictable block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.policies.policy import Policy, ScoreContext

BLOCK_SCORES = ("sum", "norm_sum")


@dataclass(frozen=True)
class BlockRule:
    """When a request evicts, what it keeps, and how many of its blocks go (counts only)."""

    block_size: int
    kv_size: int | None = None  # one budget for every request (None: per prompt, or no eviction)
    start_blocks: int = 0
    recent: int = 0  # slots, under kv_size (per-prompt budgets: the policy's recent_pairs of each budget)
    in_prefill: bool = True  # evict while the prompt is being computed (prefill_and_decode)
    evicts: bool = False
    once: bool = False  # after_prefill: one compression, to exactly the budget, when the prompt is computed
    whole_prompt: bool = False  # the prompt fed in one chunk (Policy.whole_prompt: scored in the prompt's forward)

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
            evicts=True,
            once=policy.once,
            whole_prompt=policy.whole_prompt is not None,
        )

    def min_kv_size(self, recent: int | None = None) -> int:
        """The smallest budget that always leaves room for one new token after evicting."""
        r = self.recent if recent is None else recent
        return self.start_blocks * self.block_size + r + self.block_size

    def applies(self, req) -> bool:
        """Whether the request evicts before its next chunk."""
        if not self.evicts or req.budget is None:
            return False
        if self.once:
            return not req.compressed and req.num_computed >= len(req.prompt)
        return self.in_prefill or req.num_computed >= len(req.prompt)

    def span(self, req) -> int:
        """The most tokens the request's next chunk may feed: a recomputed request (prompt + its output so far,
        after a preemption) must meet its rule where its first run did, so no chunk crosses a point where the
        first run evicted. The prompt's end: the one compression (after_prefill) and a decode_only request's first
        eviction happen there, over the prompt alone. Past it, under the schedules that evict while decoding, the
        next decode step that evicted: the first run fed one token a step and evicted e1 blocks before a token
        when it would go over budget, so the chunk evicts those e1 blocks and then feeds what fits without another
        eviction (a causal chunk gives each of its queries the keys, and the attention statistics, its decode
        step had). after_prefill evicts nothing after the compression: the output replays in chunks."""
        if not self.evicts or req.budget is None:
            return req.remaining
        if req.num_computed < len(req.prompt):
            return len(req.prompt) - req.num_computed
        if self.once:
            return req.remaining
        bs = self.block_size
        e1 = torch.clamp(-(-(req.held + 1 - req.budget) // bs), min=0)  # (L, H) blocks one decode token evicts
        return min(req.remaining, int((req.budget - req.held + e1 * bs).min()))

    def evictable_end(self, held: torch.Tensor, recent: torch.Tensor) -> torch.Tensor:
        """(L, H) end of the evictable area (logical blocks [start_blocks, end)): full blocks older than the
        recent area."""
        return torch.clamp((held - recent) // self.block_size, min=self.start_blocks)

    def evictable(self, n_slots: int, recent: int | None = None) -> range:
        """Logical block indices of the evictable area for one (layer, KV head) holding n_slots."""
        r = self.recent if recent is None else recent
        end = (n_slots - r) // self.block_size
        return range(self.start_blocks, max(self.start_blocks, end))

    def plan(self, held: torch.Tensor, recent: torch.Tensor, budget: torch.Tensor, k: int) -> tuple[int, torch.Tensor]:
        """(tokens it may feed, (L, H) blocks each (layer, KV head) evicts first) for a request holding `held`
        (L, H) that wants k: the fewest whole blocks that keep every (layer, KV head) within its budget."""
        bs = self.block_size
        n_evictable = self.evictable_end(held, recent) - self.start_blocks  # (L, H)
        if self.once:  # to exactly the budget (in whole blocks: at most it), then every token is kept
            return k, torch.minimum(torch.clamp(-(-(held - budget) // bs), min=0), n_evictable)
        floor = held - n_evictable * bs
        k = max(0, min(k, int((budget - floor).min())))
        return k, torch.clamp(-(-(held + k - budget) // bs), min=0)


def block_scores(policy: Policy, stats: ScoreContext, block_size: int, mode: str = "sum",
                 per_head: bool = False) -> torch.Tensor:
    """Score of each full block from the policy's pair scores (stats of one request, N slots): (n_blocks,)
    summed over layers and KV heads, or with `per_head` (L, H_kv, n_blocks)."""
    s = policy.score(stats).float()  # (L, 1, H, N)
    s = s.expand(stats.pos.shape)
    if mode == "norm_sum":
        life = (stats.last + 1 - stats.pos).clamp(min=1).float()
        s = s / life
    nb = s.shape[-1] // block_size
    if per_head:
        return s[:, 0, :, : nb * block_size].unflatten(-1, (nb, block_size)).sum(-1)  # (L, H, nb)
    per_slot = s.sum(dim=(0, 1, 2))  # (N,)
    return per_slot[: nb * block_size].view(nb, block_size).sum(-1)


def choose(scores: torch.Tensor, start: int, end: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """(L, H, nb) bool: the n[l, h] lowest-scored blocks of (l, h) among [start, end[l, h]); on equal scores
    the older block goes first. `scores`: (nb,) (the same blocks in every head) or (L, H, nb)."""
    nb = scores.shape[-1]
    j = torch.arange(nb)
    cand = (j >= start) & (j < end[..., None])  # (L, H, nb)
    s = scores.expand(cand.shape).masked_fill(~cand, float("inf"))
    order = torch.sort(s, dim=-1, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, j.expand(cand.shape).contiguous())
    return (rank < n[..., None]) & cand


def oldest(start: int, end: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """(L, H, nb) bool: the n[l, h] oldest evictable blocks (no scores)."""
    nb = int(end.max()) if end.numel() else 0
    j = torch.arange(nb)
    return (j >= start) & (j < start + n[..., None]) & (j < end[..., None])


def choose_blocks(scores: torch.Tensor, candidates: range, n: int) -> list[int]:
    """The n lowest-scored candidate blocks of one table ((nb,) scores); on equal scores the older goes first."""
    got = choose(scores, candidates.start, torch.tensor([[candidates.stop]]), torch.tensor([[n]]))
    return got[0, 0].nonzero().flatten().tolist()
