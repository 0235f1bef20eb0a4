"""The batch's plan (kvbench.batch_plan) is what the engine executes: for every registered policy, at every forward,
the cache's groups hold the counts and the slots the plan says, and the plan's decisions are the schedule's rules
(worked by hand on a small case)."""

from __future__ import annotations

import pytest
import torch

from kvbench.attention import kv_attention
from kvbench.batch_plan import EVICT, RESIZE, TRIM, BatchPlan, Room
from kvbench.engine import generate_batch
from kvbench.engine import loop as engine_loop
from kvbench.policies import H2O, Full, SnapKV, registry
from tests.conftest import random_prompts
from tests.policies.test_scored import _at_test_size

LENGTHS = (90, 70, 40)


@pytest.mark.parametrize("question", [None, [6, 9, 4]], ids=["aware", "agnostic"])
@pytest.mark.parametrize("name", sorted(registry()))
def test_the_cache_follows_the_plan_at_every_forward(name, question, tiny_llama, monkeypatch):
    policy = _at_test_size(name)
    if question and policy.once is False and policy.evicts and policy.kv_size is not None:
        policy.kv_size = 48  # room for the questions (kvbench.budgets.question)
    seen = []
    real = engine_loop.execute

    def execute(cache, step, policy, observer):
        real(cache, step, policy, observer)
        seen.append((step, [int((g.n + step.tokens).max()) for g in cache.groups], [g.capacity for g in cache.groups]))

    monkeypatch.setattr(engine_loop, "execute", execute)
    policy.prepare(tiny_llama.tokenizer, tiny_llama.model)  # as kvbench.engine.generate does
    with kv_attention(tiny_llama.model, hidden=policy.needs.hidden):
        generate_batch(tiny_llama.model, random_prompts(LENGTHS, seed=3), policy, max_new_tokens=6,
                       question_tokens=question)
    assert len(seen) >= 6
    adaptive = policy.evicts and policy.head_budget != "uniform"
    for step, held, caps in seen:  # held: the most pairs a row holds once the forward's tokens are written
        assert list(step.capacities) == caps, (step.kind, step.capacities, caps)
        assert all(n <= k if adaptive else n == k for n, k in zip(held, step.keys, strict=True)), (step, held)
    kinds = [s.kind for s, *_ in seen]
    assert kinds.count("question") == (question is not None) and kinds[-1] == "decode"


def test_the_plan_of_decode_only_compresses_once_then_evicts_every_p():
    """Budget 16, p = 4, prompts of 20 and 10 tokens, 8 new tokens: the first decode step compresses the 20-token
    prompt to 12 (k - p) and gives the prompt's slots back (16 slots); the 10-token prompt fills up to 16 and
    then evicts p; every eviction keeps 12."""
    policy = H2O(kv_size=16, evict_every=4, schedule="decode_only")
    budget = torch.tensor([16, 16])
    steps = list(BatchPlan(policy, [Room(20, budget, None)], [torch.tensor([20, 10])], 8, batch_size=2))
    assert [s.kind for s in steps] == ["prefill"] + ["decode"] * 7
    first = steps[1].before
    assert [(a.kind, a.rows.tolist()) for a in first if a.kind == EVICT] == [(EVICT, [True, False])]
    assert [(a.kind, a.capacity) for a in first if a.kind == RESIZE] == [(RESIZE, 16)]
    assert steps[1].capacities == (16,) and steps[0].capacities == (20,)
    evicted = [(i, a.rows.tolist()) for i, s in enumerate(steps) for a in s.before if a.kind == EVICT]
    # sample 0: 12 after step 1, +1 per step: full (16) at step 4, evicts before step 5; sample 1: 10, +1 per
    # step: 16 after step 6, evicts before step 7
    assert evicted == [(1, [True, False]), (5, [True, False]), (7, [False, True])], evicted
    assert all(int(a.keep[a.rows].max()) == 12 for s in steps for a in s.before if a.kind == EVICT)
    assert [s.keys for s in steps] == [(20,), (13,), (14,), (15,), (16,), (15,), (16,), (15,)]  # the larger row


def test_the_plan_trims_a_window_and_compresses_a_question():
    """A windowed group (W = 8, 12 slots) keeps its newest 7 pairs before a forward it
    could not hold; query-agnostic after_prefill compresses the context to its budget before the question, once."""
    policy = SnapKV(kv_size=6, schedule="after_prefill", window=2)
    rooms = [Room(12, torch.tensor([6, 6]), None), Room(12, None, 8)]
    chunks = [torch.tensor([6, 0]), torch.tensor([4, 6])]
    steps = list(BatchPlan(policy, rooms, chunks, 3, question=torch.tensor([3, 2]), batch_size=2))
    assert [s.kind for s in steps] == ["prefill", "prefill", "question", "decode", "decode"]
    assert steps[1].before == () and steps[1].keys == (10, 10)  # 12 slots hold 6 + 4: no trim
    q = steps[2].before
    assert [(a.kind, a.group, a.rows.tolist()) for a in q] == [(TRIM, 1, [True, False]), (EVICT, 0, [True, False])]
    assert q[0].keep.tolist() == [7, 7] and q[1].keep.tolist() == [6, 6] and steps[2].evicts
    assert steps[2].keys == (9, 10) and all(not s.before for s in steps[3:])  # 7 + 3, 6 + 2 + 2


@pytest.mark.parametrize("schedule", ["decode_only", "after_prefill"])
def test_a_window_the_batch_never_cuts_is_full_attention(schedule):
    """A sliding window longer than every sequence of the batch cuts nothing: the policy compresses that layer like
    a full-attention one (its budgets and slots were a full layer's; the cache had made it a windowed group that
    trimmed to W - 1 pairs more than it held, and crashed)."""
    from kvbench.engine import generate
    from tests.models.test_family import model

    lm = model("mistral-window")  # window 16; 10 prompt tokens + 4 new never reach it
    prompt, policy = [list(range(3, 13))], H2O(kv_size=8, evict_every=2, schedule=schedule)
    windowed = generate(lm.model, lm.tokenizer, prompt, policy, max_new_tokens=4).token_ids
    saved, lm.model.config.sliding_window = lm.model.config.sliding_window, None
    try:
        full = generate(lm.model, lm.tokenizer, prompt, policy, max_new_tokens=4).token_ids
    finally:
        lm.model.config.sliding_window = saved
    assert windowed == full and len(full[0]) == 4


PLANS = [  # (policy, rooms, chunks): evictions in prefill and decode, a window's trims, a data-dependent fit, none
    (H2O(kv_size=16, evict_every=4, schedule="decode_only"), [Room(20, torch.tensor([16, 16]), None)], [[20, 10]]),
    (H2O(kv_size=8, evict_every=3), [Room(12, torch.tensor([8, 8]), None), Room(12, None, 8)], [[4, 2]] * 3),
    (SnapKV(kv_size=6, schedule="after_prefill", window=2), [Room(12, torch.tensor([6, 6]), None), Room(12, None, 8)],
     [[6, 0], [4, 6]]),
    (Full(), [Room(60, None, None)], [[20, 10]]),
]


@pytest.mark.parametrize("policy,rooms,chunks", PLANS, ids=["decode_only", "window", "after_prefill", "none"])
def test_the_runs_are_the_steps(policy, rooms, chunks):
    """`BatchPlan.runs` folds each stretch of quiet decode steps into its first: n steps that differ only by their keys
    (one more a step), so the account reads a batch in as many iterations as it has actions."""
    def plan():
        return BatchPlan(policy, rooms, [torch.tensor(c) for c in chunks], 40, batch_size=2)

    def actions(step):
        return [(a.kind, a.group, None if a.rows is None else a.rows.tolist(), None if a.keep is None else a.keep.tolist(),
                 a.held, a.most, a.capacity, a.fit) for a in step.before]

    steps = list(plan())
    expanded = [(s.kind, tuple(k + j for k in s.keys), s.capacities, actions(s) if j == 0 else [])
                for s, n in plan().runs() for j in range(n)]
    assert [(s.kind, s.keys, s.capacities, actions(s)) for s in steps] == expanded
    assert any(actions(s) for s in steps[len(chunks) + 1:]) == (policy.kv_size == 16 or len(rooms) > 1)
    assert len(list(plan().runs())) < len(steps)


def test_the_account_replays_a_long_generation_in_few_steps(monkeypatch):
    """The account folds the batch's plan; a quiet decode stretch is one iteration, so the full cache over 20,000 new
    tokens (no action while decoding) takes a handful, not one per token (memory and minutes for absurd lengths)."""
    from kvbench import memory
    from tests.memory.test_account import SMOLLM2

    calls = []
    real = BatchPlan._step
    monkeypatch.setattr(BatchPlan, "_step", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    short = memory.account(SMOLLM2, [1500] * 4, Full(), max_new_tokens=200)
    long = memory.account(SMOLLM2, [1500] * 4, Full(), max_new_tokens=20_000)
    assert len(calls) < 10, len(calls)
    assert long.devices["cpu"].kv_cache > short.devices["cpu"].kv_cache and len(long.devices["cpu"].kv_steps) == 20_000
