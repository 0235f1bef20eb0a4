"""The plan of one batch: every forward and, before it, every eviction, window trim and resize, on counts alone.

Pure: the batch's (context) lengths, the policy, its groups of layers (`Room`: capacity, budget row, window), the
prefill chunks, the question split and max_new_tokens in; `Step`s out, lazily, one per forward. The engine
executes them (kvbench.engine.evictions: its evictions, trims and resizes are the plan's, nothing is decided there)
and the memory account folds them (kvbench.memory.accounting: the largest transient, the cache's bytes at every
forward), so the account follows the engine by construction.

Counts are deterministic given the lengths: EOS changes none (a finished sample keeps decoding pads). Per group
the plan tracks `load` (B,), the pairs a row holds per head on average (what the schedule evicts on, exact), and
`most` (B,), the most pairs one head holds: the same but under a head rule that chooses the counts at runtime
(AdaKV), where it is the rule's bound (`knobs.head_slots` of what the eviction keeps), which the cache's slots and
the account's widths use. Under a rule whose counts depend on the scores' values (`data_dependent`: DMS's
threshold) the first eviction while decoding is followed by a `fit` resize (to what the rows really hold + the tokens
to come, at most the bound): the account charges the bound, the cache holds at most that. The rules themselves: `kvbench.schedule.rows_to_evict` (which rows evict before a
forward), `kvbench.budgets.knobs` (what they keep, the slots a compressed prompt needs),
`kvbench.budgets.question` (query-agnostic runs: the context compressed before its question).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from kvbench.budgets import head_rule, knobs, question
from kvbench.grid import grid_chunks
from kvbench.schedule import prefill_chunks, rows_to_evict

TRIM, EVICT, RESIZE = "trim", "evict", "resize"


def prefill_chunks_of(lengths: list[int], policy, chunk: int | None, budgets: torch.Tensor | None,
                      hybrid: bool = False) -> list[torch.Tensor]:
    """The prefill forwards' real tokens per sample ((B,) each): the schedule's per-sample blocks
    (`kvbench.schedule.prefill_chunks`), on one grid for a hybrid model (`kvbench.grid`); none for empty contexts."""
    if not max(lengths):
        return []
    return (grid_chunks if hybrid else prefill_chunks)(lengths, policy, chunk, budgets)


@dataclass(frozen=True)
class Room:
    """One group of layers as the plan sees it: its slots, its (B,) budgets (None: never evicted by the policy)
    and its sliding window (None: the policy's to compress)."""

    capacity: int
    budget: torch.Tensor | None
    window: int | None


@dataclass(frozen=True)
class Action:
    """Before a forward, in group `group`: `trim` (a windowed group keeps its newest `keep` pairs in `rows`), `evict`
    (the policy keeps `keep` (B,) pairs per head, on average, in `rows`) or `resize` (to `capacity` slots; with
    `fit`, to the most pairs a row holds + `fit` when fewer: what a data-dependent head rule really kept, the
    capacity its bound). `held`: the most pairs one head of an evicting row holds before; `most`: the most it
    keeps (bounds)."""

    kind: str
    group: int
    rows: torch.Tensor | None = None  # (B,) bool
    keep: torch.Tensor | None = None  # (B,) long
    held: int = 0
    most: int = 0
    capacity: int = 0
    fit: int | None = None


@dataclass(frozen=True)
class Step:
    """One forward: `tokens` (B,) real tokens per sample, right-aligned in `width`; `kind` prefill | question |
    decode; `logits`: it makes the next token's logits. `before`: the actions ahead of it, trims first;
    `evicts`: the eviction section runs (timed, observed). `keys`: per group, the most keys one head attends
    over in it; `capacities`: per group, its slots during it."""

    kind: str
    tokens: torch.Tensor
    width: int
    logits: bool
    before: tuple[Action, ...]
    evicts: bool
    keys: tuple[int, ...]
    capacities: tuple[int, ...]


class BatchPlan:
    """The steps of one batch (iterate: one `Step` per forward, computed as they are asked for)."""

    def __init__(self, policy, rooms: list[Room], chunks: list[torch.Tensor], max_new_tokens: int,
                 question: torch.Tensor | None = None, heads: int | None = None, batch_size: int | None = None):
        self.policy, self.rooms, self.chunks, self.heads = policy, list(rooms), list(chunks), heads
        self.max_new_tokens = max_new_tokens
        self.question = question if question is not None and bool(question.any()) else None  # (B,)
        B = batch_size or len(chunks[0] if chunks else question)
        self.batch_size = B
        never = torch.iinfo(torch.long).max // 4
        self.budget = torch.stack([torch.full((B,), never, dtype=torch.long, device="cpu") if r.budget is None
                                   else r.budget.to(torch.long).cpu() for r in self.rooms]) if rooms else None  # (G, B)

    def __iter__(self) -> Iterator[Step]:
        return (step for step, _ in self.runs(collapse=False))

    def runs(self, collapse: bool = True) -> Iterator[tuple[Step, int]]:
        """(step, n): every step once, where a decode step is followed by n - 1 quiet ones (no trim, eviction or
        resize before them: their keys grow by one a forward, nothing else changes), folded into it. The account
        reads these (what the steps it skips would charge is the last one's, at most), in as many iterations
        as the batch has actions, whatever max_new_tokens is; the engine iterates one step per forward."""
        p, B = self.policy, self.batch_size
        G = len(self.rooms)
        self.load = torch.zeros(G, B, dtype=torch.long, device="cpu")  # (G, B) pairs per head on average
        self.most = torch.zeros(G, B, dtype=torch.long, device="cpu")  # (G, B) the most one head holds (bound)
        self.caps = [r.capacity for r in self.rooms]
        self.fitted: set[int] = set()  # groups a data-dependent rule's first decode-time eviction shrank
        agnostic = self.question is not None
        last = len(self.chunks) - 1
        for k, r in enumerate(self.chunks):
            yield self._step("prefill", r, not agnostic and k == last, self._before(r, prefill=True)), 1
        if agnostic:
            q = self.question
            yield self._step("question", q, True, self._trims(q) + self._compress(q), evicts=p.evicts), 1
        ones = torch.ones(B, dtype=torch.long, device="cpu")
        i = 1
        while i < self.max_new_tokens:
            step = self._step("decode", ones, True, self._before(ones, prefill=False, first=i == 1 and not agnostic))
            n = 1 + min(self._quiet(), self.max_new_tokens - 1 - i) if collapse and i > 1 else 1
            self.load += n - 1
            self.most += n - 1
            yield step, n
            i += n

    def _quiet(self) -> int:
        """How many of the next decode steps have nothing before them: no windowed group outgrows its slots and no
        row reaches its budget (after_prefill evicts at the first decode step only, handled by the caller)."""
        room = [c - int(self.most[gi].max()) for gi, c in enumerate(self.caps) if self.rooms[gi].window is not None]
        if self.policy.evicts and not self.policy.once:
            full = [gi for gi, r in enumerate(self.rooms) if r.window is None]
            room += [int((self.budget[full] - self.load[full]).min())] if full else []
        return max(0, min(room, default=self.max_new_tokens))

    # ------------------------------------------------------------------ one step
    def _step(self, kind: str, r: torch.Tensor, logits: bool, before: list[Action], evicts: bool | None = None) -> Step:
        caps = tuple(self.caps)  # a resize before the forward is in force during it
        self.load += r
        self.most += r
        keys = tuple(max(row) for row in self.most.tolist())  # Python's max: no torch kernel per step (issue 42)
        if evicts is None:
            evicts = any(a.kind == EVICT for a in before)
        return Step(kind, r, max(r.tolist()), logits, tuple(before), evicts, keys, caps)

    def _trims(self, r: torch.Tensor) -> list[Action]:
        """Windowed groups that could not hold r (B,) more tokens keep their newest W - 1 pairs (all a query of
        this forward can still see)."""
        out = []
        for gi, room in enumerate(self.rooms):
            if room.window is None:
                continue
            rows = (self.most[gi] + r > self.caps[gi]) & (r > 0)
            if bool(rows.any()):
                keep = torch.full((self.batch_size,), room.window - 1, dtype=torch.long, device="cpu")
                out.append(Action(TRIM, gi, rows, keep, int(self.most[gi][rows].max()), room.window - 1))
                self._set(gi, rows, keep, keep)
        return out

    def _before(self, r: torch.Tensor, prefill: bool, first: bool = False) -> list[Action]:
        """Trims, then the policy's evictions (and a compressed prompt's resize) before a forward of r (B,)."""
        out = self._trims(r)
        p = self.policy
        if not p.evicts or not self.rooms:
            return out
        rows = rows_to_evict(self.load, r, p, prefill, self.budget, first)  # (G, B) every group at once
        if rows is None:
            return out
        for gi, room in enumerate(self.rooms):
            if room.window is not None or not bool(rows[gi].any()):
                continue
            out.append(self._evict(gi, rows[gi], knobs.keep(p, self.budget[gi])))
            if not prefill:  # the prompt is compressed: give its memory back
                need = knobs.decode_capacity(p, int(self.budget[gi].max()), self.max_new_tokens, self.heads)
                out += self._resize(gi, need)
                if head_rule(p).data_dependent and gi not in self.fitted:  # the counts are the data's: once, shrink
                    self.fitted.add(gi)  # to what was kept (the tokens to come fit beside it)
                    out.append(Action(RESIZE, gi, capacity=self.caps[gi], fit=self.max_new_tokens))
        return out

    def _compress(self, q: torch.Tensor) -> list[Action]:
        """Query-agnostic: before the question's q (B,) tokens, each compressed group's context goes down to
        `question.context_keep` where it must (after_prefill: to its budget), so the question fits its budget."""
        p, out = self.policy, []
        if not p.evicts:
            return out
        for gi, room in enumerate(self.rooms):
            if room.window is not None:
                continue
            k = self.budget[gi]
            bad = question.no_room(p, k, self.load[gi], q)  # (B,) the preflight asks the same of the prompts
            if bool(bad.any()):
                b = int(bad.nonzero()[0])
                raise ValueError("query_aware=false: " + question.refusal(int(q[b]), int(k[b]),
                                                                          int(question.protected(p, k)[b])))
            rows = self.load[gi] > k if p.once else self.load[gi] + q > k
            if bool(rows.any()):
                out.append(self._evict(gi, rows, question.context_keep(p, k, q)))
            need = knobs.decode_capacity(p, int(k.max()), self.max_new_tokens + int(q.max()), self.heads)
            out += self._resize(gi, need)
        return out

    def _evict(self, gi: int, rows: torch.Tensor, keep: torch.Tensor) -> Action:
        most = torch.minimum(knobs.head_slots(self.policy, keep, self.heads), self.most[gi])  # (B,) the largest head
        act = Action(EVICT, gi, rows, keep, int(self.most[gi][rows].max()), int(most[rows].max()))
        self._set(gi, rows, keep, most)
        return act

    def _resize(self, gi: int, need: int) -> list[Action]:
        if self.caps[gi] > need and int(self.most[gi].max()) < need:
            self.caps[gi] = need
            return [Action(RESIZE, gi, capacity=need)]
        return []

    def _set(self, gi: int, rows: torch.Tensor, load: torch.Tensor, most: torch.Tensor) -> None:
        self.load[gi] = torch.where(rows, load, self.load[gi])
        self.most[gi] = torch.where(rows, most, self.most[gi])
