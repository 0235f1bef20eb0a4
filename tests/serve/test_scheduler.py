"""Block manager and scheduler alone (no model): ownership, freeing, FCFS, preemption, budgets, eviction counts,
and pages owned per (layer, KV head): the pool's free-page count follows each head's own budget."""

from __future__ import annotations

import pytest
import torch

from kvbench.serve.block_evict import BlockRule
from kvbench.serve.blocks import BlockManager, blocks_for
from kvbench.serve.request import Request
from kvbench.serve.scheduler import Scheduler


def owned(r: Request, bs: int) -> list[int]:
    """The pages a request holds, every (layer, KV head)'s."""
    if r.pages is None:
        return []
    return r.pages[torch.arange(r.pages.shape[-1]) < blocks_for(r.held, bs)[..., None]].tolist()


def check_ownership(bm: BlockManager, reqs: list[Request]) -> None:
    held = [b for r in reqs for b in owned(r, bm.block_size)]
    assert len(held) == len(set(held)), "a page is owned by two requests"
    assert set(held).isdisjoint(bm.free_ids)
    assert len(held) + bm.num_free == bm.num_pages
    assert len(set(bm.free_ids)) == len(bm.free_ids)


def simulate(sched: Scheduler, reqs: list[Request], max_steps=10_000, on_step=None):
    """Drive the scheduler like the engine does, with a fake token; returns the plans."""
    for r in reqs:
        sched.add(r)
    plans = []
    for _ in range(max_steps):
        if not sched.running and not sched.waiting:
            break
        plan = sched.schedule()
        assert plan.scheduled or plan.preempted, "no progress"
        for s in plan.scheduled:
            s.req.num_computed += s.num_tokens
            sched.bm.advance(s.req, s.num_tokens)
        check_ownership(sched.bm, reqs)
        for s in plan.scheduled:
            if s.req.remaining == 0:
                s.req.output.append(7)
                if len(s.req.output) >= s.req.max_new_tokens:
                    sched.finish(s.req)
        if on_step:
            on_step(plan)
        plans.append(plan)
    else:
        raise AssertionError("did not finish")
    return plans


def reqs_of(lengths, new=4):
    return [Request(rid=i, prompt=[1] * n, max_new_tokens=new, arrival=float(i)) for i, n in enumerate(lengths)]


def test_block_manager_hands_out_and_takes_back():
    bm = BlockManager(5, 4)
    a, b = Request(0, [1], 1), Request(1, [1], 1)
    bm.admit(a)
    bm.admit(b)
    bm.grow(a, 8)
    bm.grow(b, 12)
    assert not bm.can_allocate(1) and set(owned(a, 4)).isdisjoint(owned(b, 4))
    bm.advance(a, 8)
    with pytest.raises(RuntimeError):
        bm.grow(a, 1)
    bm.advance(b, 12)
    bm.evict(b, torch.tensor([[[False, True, False]]]))
    assert bm.num_free == 1 and int(b.held) == 8 and len(owned(b, 4)) == 2
    bm.free(a)
    assert bm.num_free == 3 and a.pages is None


def test_pages_are_freed_head_by_head():
    """Pages owned per (layer, KV head): a head that evicts gives its pages back alone, and an uneven split of
    the same total takes as many pages as the uniform one, head by head."""
    bm = BlockManager(10, 4, shape=(2, 3))  # 10 blocks = 60 pages
    r = Request(0, [1] * 16, 4)
    bm.admit(r)
    bm.grow(r, 16)
    bm.advance(r, 16)
    assert bm.num_free == 60 - 6 * 4
    which = torch.zeros(2, 3, 4, dtype=torch.bool)
    which[1, 2, 1:3] = True  # layer 1, KV head 2 evicts two of its four blocks
    bm.evict(r, which)
    assert bm.num_free == 60 - 6 * 4 + 2 and r.held.tolist() == [[16, 16, 16], [16, 16, 8]]
    bm.grow(r, 1)  # one more token: a new page in every (layer, KV head), the short head's too
    assert bm.num_free == 60 - 6 * 4 + 2 - 6


def test_all_finish_blocks_return_and_budget_holds():
    bm = BlockManager(40, 4)
    sched = Scheduler(bm, BlockRule(4), max_tokens_per_step=16)
    reqs = reqs_of([13, 5, 30, 9, 22])
    plans = simulate(sched, reqs)
    assert all(r.finished and len(r.output) == 4 for r in reqs)
    assert bm.num_free == 40
    assert max(p.num_tokens for p in plans) <= 16
    # chunked prefill: the 30-token prompt needed more than one step
    assert sum(1 for p in plans for s in p.scheduled if s.req.rid == 2 and s.num_tokens > 1) >= 2
    assert sched.preemptions == 0


def test_mixed_prefill_and_decode_in_one_step():
    sched = Scheduler(BlockManager(40, 4), BlockRule(4), max_tokens_per_step=8)
    plans = simulate(sched, reqs_of([3, 20], new=6))
    assert any({s.num_tokens == 1 for s in p.scheduled} == {True, False} for p in plans)


def test_fcfs_admission_order():
    sched = Scheduler(BlockManager(6, 4), BlockRule(4), max_tokens_per_step=64)
    reqs = reqs_of([8, 8, 8, 8], new=2)
    order = []
    simulate(sched, reqs, on_step=lambda p: order.extend(r.rid for r in p.admitted))
    first = [rid for i, rid in enumerate(order) if rid not in order[:i]]
    assert first == [0, 1, 2, 3]


def test_admission_while_blocks_are_free():
    bm = BlockManager(4, 4)
    sched = Scheduler(bm, BlockRule(4), max_tokens_per_step=64)
    for r in reqs_of([8, 8, 8], new=1):
        sched.add(r)
    plan = sched.schedule()
    assert [r.rid for r in plan.admitted] == [0, 1]  # 2 blocks each: the third does not fit
    assert [r.rid for r in sched.waiting] == [2]


def test_max_running():
    sched = Scheduler(BlockManager(40, 4), BlockRule(4), max_tokens_per_step=64, max_running=2)
    for r in reqs_of([4, 4, 4], new=3):
        sched.add(r)
    assert len(sched.schedule().admitted) == 2


def test_preemption_of_latest_arrival():
    bm = BlockManager(5, 4)
    sched = Scheduler(bm, BlockRule(4), max_tokens_per_step=64)
    reqs = reqs_of([8, 8], new=8)  # each grows to 15 slots = 4 blocks; the pool holds 5
    victims = []
    simulate(sched, reqs, on_step=lambda p: victims.extend(r.rid for r in p.preempted))
    assert victims and set(victims) == {1}
    assert sched.preemptions == len(victims) == reqs[1].preemptions
    assert sched.recomputed_tokens == reqs[1].recomputed_tokens > 0
    assert all(r.finished for r in reqs) and bm.num_free == 5


def test_preempted_request_restarts_from_zero():
    bm = BlockManager(3, 4)
    sched = Scheduler(bm, BlockRule(4), max_tokens_per_step=64)
    a, b = reqs_of([4, 4], new=6)
    for r in (a, b):
        sched.add(r)
    seen = []
    for _ in range(6):
        plan = sched.schedule()
        for s in plan.scheduled:
            s.req.num_computed += s.num_tokens
            bm.advance(s.req, s.num_tokens)
            if s.req.remaining == 0:
                s.req.output.append(7)
        if plan.preempted:
            seen.append(plan.preempted[0])
            break
    assert seen == [b] and b.num_computed == 0 and b.pages is None and b in sched.waiting
    assert b.output  # its output is kept and recomputed as prompt
    assert b.remaining == b.seq_len


def test_eviction_keeps_budget_and_protected_blocks():
    rule = BlockRule(block_size=4, kv_size=16, start_blocks=1, recent=4, evicts=True)
    bm = BlockManager(30, 4)
    evicted = []

    def evictor(req, end, n):
        e, k = int(end.max()), int(n.max())
        assert e * 4 <= req.n_slots - 4  # recent area
        evicted.append(k)
        which = torch.zeros(1, 1, e, dtype=torch.bool)
        which[..., max(1, e - k):e] = True  # the newest evictable, never block 0 (the start area)
        return which

    sched = Scheduler(bm, rule, max_tokens_per_step=64, evictor=evictor)
    reqs = reqs_of([30, 7], new=20)

    def after(plan):
        for r in reqs:
            if not r.finished:
                assert r.n_slots <= 16 and len(owned(r, 4)) <= 4

    simulate(sched, reqs, on_step=after)
    assert sum(evicted) > 0 and all(r.finished for r in reqs)


def test_decode_only_evicts_after_the_prompt():
    rule = BlockRule(block_size=4, kv_size=8, recent=0, in_prefill=False, evicts=True)
    sched = Scheduler(BlockManager(30, 4), rule, max_tokens_per_step=64)
    (r,) = reqs_of([20], new=5)
    peak = []
    simulate(sched, [r], on_step=lambda p: peak.append(r.n_slots))
    assert max(peak) == 20 and peak[-1] <= 8


def test_rule_plan_counts():
    rule = BlockRule(block_size=4, kv_size=16, start_blocks=1, recent=4, evicts=True)

    def plan(held, k, budget=16):
        t = torch.tensor([[held]])
        got, e = rule.plan(t, torch.tensor([[4]]), torch.tensor([[budget]]), k)
        return got, int(e)

    assert list(rule.evictable(16)) == [1, 2]
    assert plan(16, 1) == (1, 1)
    assert plan(10, 1) == (1, 0)
    assert plan(16, 100)[0] == 16 - 8  # evicting both evictable blocks leaves 8
    assert BlockRule(4).kv_size is None
    # per (layer, KV head) budgets: the tightest head bounds the chunk, each head evicts its own count
    held, recent = torch.tensor([[16, 16], [16, 16]]), torch.full((2, 2), 4)
    k, e = rule.plan(held, recent, torch.tensor([[16, 12], [20, 16]]), 2)
    assert k == 2 and e.tolist() == [[1, 2], [0, 1]]
    once = BlockRule(block_size=4, kv_size=8, evicts=True, once=True)
    k, e = once.plan(torch.tensor([[30, 30]]), torch.zeros(1, 2, dtype=torch.long), torch.tensor([[8, 13]]), 1)
    assert k == 1 and e.tolist() == [[6, 5]]  # to at most the budget, whole blocks: 6 and 10 pairs kept
