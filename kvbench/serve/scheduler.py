"""Continuous batching: what each step runs. It only decides; the runner runs.

Each step, with a budget of `max_tokens_per_step` tokens:
1. running requests in FCFS (arrival) order each get their next chunk: the rest of their prompt
   (chunked prefill, up to the budget left) or one decode token. A request over its KV budget first
   evicts the fewest whole blocks that keep it within `kv_size` (`BlockRule`; which blocks: the
   `evictor` callback, by score). If the chunk's new blocks are not free, the latest-arrived
   running request is preempted (all its blocks freed, its cursor back to zero, back to the
   waiting queue; its computed tokens count as recomputed) until they are, possibly itself.
2. if nothing was preempted, waiting requests that have arrived are admitted in FCFS order while
   the budget lasts, their first chunk's blocks are free and fewer than `max_running` run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvbench.serve.blocks import BlockManager, blocks_for
from kvbench.serve.evict import BlockRule, oldest_blocks
from kvbench.serve.request import Request

Evictor = Callable[[Request, range, int], list[int]]  # (request, evictable logical blocks, how many) -> which


@dataclass
class Scheduled:
    req: Request
    num_tokens: int
    evicted: int = 0  # blocks evicted before this chunk


@dataclass
class StepPlan:
    scheduled: list[Scheduled] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)


class Scheduler:
    def __init__(
        self,
        blocks: BlockManager,
        rule: BlockRule,
        max_tokens_per_step: int,
        max_running: int | None = None,
        evictor: Evictor | None = None,
    ):
        self.bm, self.rule = blocks, rule
        self.max_tokens = max_tokens_per_step
        self.max_running = max_running
        self.evictor = evictor or (lambda req, cand, n: oldest_blocks(cand, n))
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
        req.num_computed = req.n_slots = 0
        req.preemptions += 1
        self.preemptions += 1
        plan.preempted.append(req)
        self.add(req)

    def _chunk(self, req: Request, budget: int) -> tuple[int, int]:
        """(tokens, blocks to evict) for the request's next chunk within `budget` tokens."""
        k = min(req.remaining, budget)
        if k > 0 and self.rule.applies(req.num_computed, len(req.prompt)):
            return self.rule.plan(req.n_slots, k)
        return k, 0

    def _evict(self, req: Request, n: int) -> None:
        cand = self.rule.evictable(req.n_slots)
        which = self.evictor(req, cand, n)
        if len(which) != n or not set(which) <= set(cand):
            raise RuntimeError(f"evictor returned {which}, not {n} blocks of {cand}")
        self.bm.free_logical(req, which)
        req.n_slots -= n * self.rule.block_size
        req.evicted_blocks += n

    def _new_blocks(self, req: Request, k: int) -> int:
        return blocks_for(req.n_slots + k, self.rule.block_size) - len(req.blocks)

    def waiting_for_memory(self) -> bool:
        """Whether the first waiting request could start but for free blocks (not the step's token budget,
        not max_running): the pool is full for it."""
        if not self.waiting or (self.max_running is not None and len(self.running) >= self.max_running):
            return False
        req = self.waiting[0]
        k, e = self._chunk(req, self.max_tokens)
        return k > 0 and not e and not self.bm.can_allocate(self._new_blocks(req, k))

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.max_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            k, e = self._chunk(req, budget)
            if k == 0:
                i += 1
                continue
            if e:
                self._evict(req, e)
            need = self._new_blocks(req, k)
            while not self.bm.can_allocate(need) and self.running[-1] is not req:
                self._preempt(self.running[-1], plan)  # latest arrival, not yet scheduled this step
            if not self.bm.can_allocate(need):
                self._preempt(req, plan)
                break
            self.bm.allocate(req, need)
            plan.scheduled.append(Scheduled(req, k, e))
            budget -= k
            i += 1
        if plan.preempted:
            return plan
        while self.waiting and budget > 0 and (self.max_running is None or len(self.running) < self.max_running):
            req = self.waiting[0]
            k, e = self._chunk(req, budget)
            need = self._new_blocks(req, k)
            if k == 0 or e or not self.bm.can_allocate(need):
                break
            self.waiting.pop(0)
            self.bm.allocate(req, need)
            self.running.append(req)
            self.running.sort(key=self._key)
            plan.scheduled.append(Scheduled(req, k))
            plan.admitted.append(req)
            budget -= k
        return plan
