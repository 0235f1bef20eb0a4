"""Serving mode vs the static engine on the tiny models (float64): same greedy tokens per request."""

from __future__ import annotations

import dataclasses

import pytest

from kvbench import engine
from kvbench.errors import ConfigError
from kvbench.policies import H2O, BatchMax, Full, SnapKV, Window, registry
from kvbench.policies.kvzip import KVzip
from kvbench.policies.kvzip_plus import KVzipPlus
from kvbench.serve.engine import serve
from kvbench.serve.request import Request
from tests.conftest import random_prompts

LENGTHS = (37, 12, 25, 40, 9, 30)


def static_tokens(lm, prompts, new, eos=()):
    out = engine.generate(lm.model, lm.tokenizer, prompts, Full(), batch_size=1, max_new_tokens=new, eos_token_ids=list(eos))
    return out.token_ids


def requests(prompts, new, arrivals=None):
    return [
        Request(rid=i, prompt=list(p), max_new_tokens=new, arrival=0.0 if arrivals is None else arrivals[i])
        for i, p in enumerate(prompts)
    ]


@pytest.mark.parametrize("budget", [64, 7])
def test_full_matches_static_engine(tiny, budget):
    prompts = random_prompts(LENGTHS, seed=3)
    want = static_tokens(tiny, prompts, 10)
    reqs = requests(prompts, 10)
    out = serve(tiny.model, reqs, Full(), num_blocks=64, block_size=4, max_tokens_per_step=budget)
    assert out.preemptions == 0
    assert [r.output for r in reqs] == want
    assert out.steps > 10  # continuous batching: chunked prefill mixed with decode


def test_preemption_recompute_is_exact(tiny_llama):
    prompts = random_prompts(LENGTHS, seed=4)
    want = static_tokens(tiny_llama, prompts, 12)
    reqs = requests(prompts, 12)
    out = serve(tiny_llama.model, reqs, Full(), num_blocks=14, block_size=4, max_tokens_per_step=32)  # 56 slots
    assert out.preemptions > 0 and out.recomputed_tokens > 0
    assert [r.output for r in reqs] == want


def preempted_while_generating(monkeypatch) -> list[int]:
    """Spy on the scheduler: how many tokens each preempted request had generated when it was preempted."""
    from kvbench.serve.scheduler import Scheduler

    seen, preempt = [], Scheduler._preempt
    monkeypatch.setattr(Scheduler, "_preempt", lambda self, req, plan: seen.append(len(req.output)) or preempt(self, req, plan))
    return seen


def _after_prefill(cls):
    """The registered policy at kv 8 under after_prefill (a 4-query observation window where it has one); where a
    head pattern is the budget (DuoAttention's), every head a streaming one (retrieval heads would keep every pair)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    window = {"window": 4} if "window" in fields else {}
    budget = {"head_compression_ratio": 1.0} if "head_compression_ratio" in fields else {"kv_size": 8}
    return cls(schedule="after_prefill", evict_every=1, **window, **budget)


EVICTING = sorted(n for n, cls in registry().items() if cls().evicts)  # every registered policy but full
NOT_AFTER_PREFILL = {"extreme_decode"}  # Algorithm 2 is decoding-only: it refuses schedule=after_prefill


def test_every_evicting_policy_but_algorithm_2_runs_after_prefill():
    refused = set()
    for name in EVICTING:
        try:
            _after_prefill(registry()[name])
        except ConfigError:
            refused.add(name)
    assert refused == NOT_AFTER_PREFILL  # a new policy joins the test below, or says here why it cannot


@pytest.mark.parametrize("name", sorted(set(EVICTING) - NOT_AFTER_PREFILL))
def test_after_prefill_preempted_mid_generation_matches_the_static_engine(tiny_llama, name, monkeypatch):
    """A request preempted after it began generating is recomputed as it was computed: its prompt compressed at
    the prompt's end (not over prompt + output), then its output replayed; so its tokens stay the static engine's."""
    policy = _after_prefill(registry()[name])
    assert_preempted_serve_is_static(tiny_llama, policy, monkeypatch)


@pytest.mark.parametrize("policy", [KVzip(kv_size=8, head_budget="layerwise"),
                                    KVzipPlus(kv_size=None, compression_ratio=0.6)], ids=lambda p: p.name)
def test_kvzip_rankings_match_the_static_engine(tiny_llama, policy, monkeypatch):
    """KVzip's other rankings in serve mode: one per layer (layerwise), and kvpress's count of the whole
    (layer, KV head) table under compression_ratio (global): the static engine's pairs and tokens."""
    assert_preempted_serve_is_static(tiny_llama, policy, monkeypatch)


def assert_preempted_serve_is_static(lm, policy, monkeypatch):
    """Serve with requests preempted mid-generation (1-slot blocks, 32 of them) gives the static engine's tokens."""
    prompts = random_prompts((28, 24, 28, 14), seed=21)
    want = engine.generate(lm.model, lm.tokenizer, prompts, policy, batch_size=1, max_new_tokens=12,
                           eos_token_ids=[]).token_ids
    seen = preempted_while_generating(monkeypatch)
    reqs = requests(prompts, 12)
    out = serve(lm.model, reqs, policy, num_blocks=32, block_size=1, max_tokens_per_step=32)
    assert out.evicted_blocks > 0 and max(seen) >= 4  # preempted after 4 or more generated tokens
    assert [r.output for r in reqs] == want


@pytest.mark.parametrize("policy", [H2O(kv_size=8, evict_every=1, schedule="decode_only"),
                                    SnapKV(kv_size=8, window=4, evict_every=1, schedule="decode_only")],
                         ids=lambda p: p.name)
def test_decode_only_preempted_mid_generation_keeps_its_tokens(tiny_llama, policy, monkeypatch):
    """decode_only evicts while decoding, by scores that include the generated tokens' queries: the recompute
    feeds the prompt, then replays the output in chunks that stop where the first run evicted, so the cache
    and the tokens are those of the same requests served without preemption (not the static engine's:
    whole blocks at other moments, docs/serving.md)."""
    prompts = random_prompts((5, 6, 3, 9), seed=21)
    alone = requests(prompts, 12)
    serve(tiny_llama.model, alone, policy, num_blocks=500, block_size=2, max_tokens_per_step=32)
    seen = preempted_while_generating(monkeypatch)
    reqs = requests(prompts, 12)
    out = serve(tiny_llama.model, reqs, policy, num_blocks=15, block_size=2, max_tokens_per_step=32)
    assert out.evicted_blocks > 0 and max(seen) >= 4
    assert [r.output for r in reqs] == [r.output for r in alone]


def test_eos_is_honoured(tiny_llama):
    prompts = random_prompts(LENGTHS[:4], seed=5)
    free = static_tokens(tiny_llama, prompts, 8)
    eos = [free[0][2]]  # the third token of request 0 becomes EOS
    want = static_tokens(tiny_llama, prompts, 8, eos)
    reqs = requests(prompts, 8)
    serve(tiny_llama.model, reqs, Full(), num_blocks=64, block_size=4, max_tokens_per_step=16, eos_token_ids=eos)
    assert [r.output for r in reqs] == want
    assert len(reqs[0].output) == 3


def test_arrivals_over_time(tiny_llama):
    prompts = random_prompts(LENGTHS, seed=6)
    want = static_tokens(tiny_llama, prompts, 6)
    reqs = requests(prompts, 6, arrivals=[0.0, 0.0, 1e3, 1e3, 2e3, 2e3])
    out = serve(tiny_llama.model, reqs, Full(), num_blocks=64, block_size=4, max_tokens_per_step=16)
    assert [r.output for r in reqs] == want
    assert all(r.first_token_at >= r.arrival for r in reqs)
    assert out.wall_s >= 2e3


@pytest.mark.parametrize("policy", [Window(kv_size=16, evict_every=4, protect_first=4), BatchMax(kv_size=16, evict_every=4),
                                    H2O(kv_size=24, evict_every=1, schedule="prefill_and_decode")])
def test_eviction_invariants(tiny, policy):
    """Never over budget after eviction; start and recent areas never evicted; no shared block."""
    prompts = random_prompts(LENGTHS, seed=7)
    reqs = requests(prompts, 10)
    bs = 4
    from kvbench.serve import model_runner as runner_mod

    seen = []
    orig = runner_mod.ModelRunner.evictor

    def spy(self, req, end, n):
        got = orig(self, req, end, n)  # (L, H, nb) bool
        start = -(-policy.protect_first // bs)
        idx = got.nonzero()[:, 2]
        assert bool((idx >= start).all())
        assert bool(((idx + 1) * bs <= req.n_slots - policy.protect_recent).all())
        assert bool((got == got[:1, :1]).all())  # one budget per request: the same blocks everywhere
        kept_pos = self.pool.pos[self.pool.slots(req.pages, req.held)[0][0, 0]].tolist()
        gone = set(got[0, 0].nonzero().flatten().tolist())
        left = [p for i, p in enumerate(kept_pos) if i // bs not in gone]
        assert left[: policy.protect_first] == kept_pos[: policy.protect_first]
        seen.append(int(n[0, 0]))
        return got

    orig_step = runner_mod.ModelRunner.step
    held = []

    def step(self, scheduled):
        for s in scheduled:  # after this step's evictions and writes, within the budget
            assert s.req.n_slots + s.num_tokens <= policy.kv_size
            assert s.req.pages.shape[-1] * bs <= policy.kv_size + bs
            held.append(s.req.n_slots + s.num_tokens)
        return orig_step(self, scheduled)

    runner_mod.ModelRunner.evictor, runner_mod.ModelRunner.step = spy, step
    try:
        out = serve(tiny.model, reqs, policy, num_blocks=40, block_size=bs, max_tokens_per_step=12)
    finally:
        runner_mod.ModelRunner.evictor, runner_mod.ModelRunner.step = orig, orig_step
    assert sum(seen) == out.evicted_blocks > 0
    assert all(r.finished and len(r.output) == 10 for r in reqs)
    assert max(held) == policy.kv_size  # the budget is reached, never passed


def test_window_drops_oldest_block(tiny_llama):
    from kvbench.serve.block_evict import BlockRule

    prompts = random_prompts((30,), seed=8)
    (req,) = requests(prompts, 4)
    out = serve(tiny_llama.model, [req], Window(kv_size=16, evict_every=4, protect_first=4), num_blocks=10, block_size=4,
                max_tokens_per_step=64)
    assert out.evicted_blocks > 0
    assert BlockRule(4, 16, 1, 0).evictable(16) == range(1, 4)
