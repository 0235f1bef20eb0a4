"""A budget above what a sequence can hold (prompt + new tokens): the policy never evicts, so it must give the
full cache's tokens and cost no more than the full cache. The cache's K/V slots (measured from its tensors)
are no more than the full cache's for the same prompts (all its bytes, for a policy that keeps no statistics
or queries), the memory account equals that allocation, and the planner and the search
(tests/capacity/test_plan.py, tests/core/test_search.py) follow from the account.
"""

from __future__ import annotations

import pytest

from kvbench.engine import generate
from kvbench.policies import H2O, BatchMax, Full, PyramidKV, SnapKV, StreamingLLM, Window
from tests.conftest import random_prompts

LENGTHS, NEW = (70, 44, 57), 5  # a left-padded batch; the full cache holds 70 + 5 slots per sample
ABOVE = 100_000  # pairs: far above every sequence
POLICIES = [  # every schedule, scored and not, per-layer and adaptive head budgets
    Window(kv_size=ABOVE, evict_every=8),  # prefill_and_decode, by slicing
    StreamingLLM(kv_size=ABOVE, evict_every=8, protect_first=4),
    BatchMax(kv_size=ABOVE, evict_every=8),  # prefill_and_decode, scored
    H2O(kv_size=ABOVE, evict_every=2),  # decode_only
    SnapKV(kv_size=ABOVE, window=8, schedule="after_prefill"),
    SnapKV(kv_size=ABOVE, window=8, schedule="after_prefill", head_budget="adaptive"),
    PyramidKV(kv_size=ABOVE, evict_every=4, window=4),
]


class Allocation:
    """Engine observer: the most K/V bytes the cache's tensors held (every group, scratch slot included), and
    the most bytes it allocated in all (`allocated_bytes`: K, V, positions, statistics)."""

    def __init__(self):
        self.kv = self.total = 0

    def __call__(self, event, cache):
        kv = sum(t.numel() * t.element_size() for g in cache.groups for t in (g.k, g.v))
        self.kv, self.total = max(self.kv, kv), max(self.total, cache.allocated_bytes())


def _run(lm, policy):
    seen = Allocation()
    out = generate(lm.model, lm.tokenizer, random_prompts(LENGTHS, seed=5), policy, batch_size=len(LENGTHS),
                   max_new_tokens=NEW, eos_token_ids=[], observer=seen)
    return out, seen


@pytest.fixture(scope="module")
def full(tiny_llama):
    return _run(tiny_llama, Full())


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.name}-{p.schedule}-{p.head_budget}")
def test_a_budget_above_the_sequence_costs_what_the_full_cache_does(tiny_llama, full, policy):
    full_out, full_seen = full
    out, seen = _run(tiny_llama, policy)
    assert out.token_ids == full_out.token_ids  # it never evicts: the full cache's tokens
    assert seen.kv <= full_seen.kv, (seen.kv, full_seen.kv)  # K/V slots, measured from the cache's tensors
    if not policy.needs.attention and not policy.needs.queries:  # no per-slot statistics, no queries kept: every
        # byte the full cache's (a scored policy's statistics and SnapKV's window of queries are its own)
        assert out.kv_allocated_bytes == full_out.kv_allocated_bytes
    # the account (what admits a batch, plans and searches) is what was allocated
    assert out.accounted.devices["cpu"].kv_cache == out.kv_allocated_bytes == seen.total
