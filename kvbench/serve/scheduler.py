"""Continuous batching: what each step runs. It only decides; the runner runs, the block manager counts.

Each step feeds at most `max_tokens_per_step` tokens (`tokens_left` of them still to hand out):
1. running requests in FCFS (arrival) order each get their next chunk: the rest of their prompt
   (chunked prefill, up to the tokens left) or one decode token (a recomputed request: its output so far, in
   chunks that stop where its first run evicted, `BlockRule.span`). A request whose (layer, KV head) would
   go over its budget first evicts the fewest whole blocks that keep it within (`BlockRule.plan`; which
   blocks: the `evictor` callback, by score; schedule=after_prefill: once, when its prompt is computed).
   If the chunk's new pages are not free, the latest-arrived running request is preempted (all its pages
   freed, its cursor back to zero, back to the waiting queue; its computed tokens count as recomputed)
   until they are, possibly itself.
2. if nothing was preempted, waiting requests that have arrived are admitted in FCFS order while
   tokens are left, their first chunk's pages are free and fewer than `max_running` run. A request
   gets its budgets per (layer, KV head) when admitted (kvbench.serve.budgets).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvbench.serve.block_evict import BlockRule, oldest
from kvbench.serve.blocks import BlockManager
from kvbench.serve.request import Request

# (request, end of each head's evictable area (L, H), blocks each evicts (L, H)) -> (L, H, nb) bool: which
Evictor = Callable[[Request, torch.Tensor, torch.Tensor], torch.Tensor]
Budgeter = Callable[[Request], tuple]  # request -> (budget, recent), each (L, H) or None
Reallocator = Callable[[Request], None]  # sets req.budget (L, H) from scores, before the one compression


@dataclass
class Scheduled:
    req: Request
    num_tokens: int
    evicted: int = 0  # pages evicted before this chunk


@dataclass
class StepPlan:
    scheduled: list[Scheduled] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)


def _uniform(rule: BlockRule) -> Budgeter:
    """One kv_size for every request and head (the counts-only replays and tests)."""
    def budget(req):
        if rule.kv_size is None:
            return None, None
        return torch.tensor([[rule.kv_size]]), torch.tensor([[rule.recent]])
    return budget


class Scheduler:
    def __init__(self, blocks: BlockManager, rule: BlockRule, max_tokens_per_step: int, max_running: int | None = None,
                 evictor: Evictor | None = None, budgets: Budgeter | None = None,
                 reallocate: Reallocator | None = None):
        self.bm, self.rule = blocks, rule
        self.max_tokens = max_tokens_per_step
        self.max_running = max_running
        self.evictor = evictor or (lambda req, end, n: oldest(rule.start_blocks, end, n))
        self.budgets = budgets or _uniform(rule)
        self.reallocate = reallocate  # head-adaptive budgets: the split across heads, when a request compresses
        self.waiting: list[Request] = []  # arrived, FCFS
        self.running: list[Request] = []  # FCFS (arrival order)
        self.preemptions = 0
        self.recomputed_tokens = 0

    @staticmethod
    def _key(r: Request):
        return (r.arrival, r.rid)

    def add(self, req: Request) -> None:
        self.waiting.append(req)
        self.waiting.sort(key=self._key)

    def finish(self, req: Request) -> None:
        req.finished = True
        self.running.remove(req)
        self.bm.free(req)

    def _preempt(self, req: Request, plan: StepPlan) -> None:
        self.running.remove(req)
        self.bm.free(req)
        req.recomputed_tokens += req.num_computed
        self.recomputed_tokens += req.num_computed
        req.num_computed = 0
        req.preemptions += 1
        self.preemptions += 1
        plan.preempted.append(req)
        self.add(req)

    def _start(self, req: Request) -> None:
        """Empty tables and the request's budgets (before its first chunk is planned)."""
        if req.held is None:
            self.bm.admit(req)
            req.budget, req.recent = self.budgets(req)

    def _chunk(self, req: Request, tokens_left: int) -> tuple[int, torch.Tensor | None]:
        """(tokens, (L, H) blocks to evict, or None) for the request's next chunk of at most `tokens_left` tokens."""
        span = self.rule.span(req)
        k = min(span, tokens_left)
        if self.rule.whole_prompt and req.in_prefill and k < span:
            return 0, None  # its prompt in one forward: it waits for a step with room for it
        if k > 0 and self.rule.applies(req):
            if self.rule.once and self.reallocate is not None:
                self.reallocate(req)
            k, e = self.rule.plan(req.held, req.recent, req.budget, k)
            return k, e if bool(e.any()) else None
        return k, None

    def _evict(self, req: Request, n: torch.Tensor) -> int:
        end = self.rule.evictable_end(req.held, req.recent)
        which = self.evictor(req, end, n)
        got = which.sum(-1)
        if not torch.equal(got, n) or bool((which & (torch.arange(which.shape[-1]) >= end[..., None])).any()):
            raise RuntimeError(f"evictor returned {got.tolist()} blocks per head, not {n.tolist()} in the evictable area")
        self.bm.evict(req, which)
        pages = int(n.sum())
        req.evicted_blocks += pages // self.bm.pages_per_block
        return pages

    def waiting_for_memory(self) -> bool:
        """Whether the first waiting request could start but for free pages (not the step's tokens left,
        not max_running): the pool is full for it."""
        if not self.waiting or (self.max_running is not None and len(self.running) >= self.max_running):
            return False
        req = self.waiting[0]
        self._start(req)
        k, e = self._chunk(req, self.max_tokens)
        return k > 0 and e is None and not self.bm.can_allocate(self.bm.need(req, k))

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        tokens_left = self.max_tokens
        i = 0
        while i < len(self.running) and tokens_left > 0:
            req = self.running[i]
            k, e = self._chunk(req, tokens_left)
            if k == 0:
                i += 1
                continue
            evicted = self._evict(req, e) if e is not None else 0
            if self.rule.once and self.rule.applies(req):
                req.compressed = True
            need = self.bm.need(req, k)
            while not self.bm.can_allocate(need) and self.running[-1] is not req:
                self._preempt(self.running[-1], plan)  # latest arrival, not yet scheduled this step
            if not self.bm.can_allocate(need):
                self._preempt(req, plan)
                break
            self.bm.grow(req, k)
            plan.scheduled.append(Scheduled(req, k, evicted))
            tokens_left -= k
            i += 1
        if plan.preempted:
            return plan
        while self.waiting and tokens_left > 0 and (self.max_running is None or len(self.running) < self.max_running):
            req = self.waiting[0]
            self._start(req)
            k, e = self._chunk(req, tokens_left)
            if k == 0 or e is not None or not self.bm.can_allocate(self.bm.need(req, k)):
                break
            self.waiting.pop(0)
            self.bm.grow(req, k)
            self.running.append(req)
            self.running.sort(key=self._key)
            plan.scheduled.append(Scheduled(req, k))
            plan.admitted.append(req)
            tokens_left -= k
        return plan
