"""A newcomer's policy scored from the last 8 queries' attention: one class (here, a test's, registered the way a
policy file registers), its rule in the reference, nothing else. It runs in static mode (kept pairs and tokens
against the brute-force reference), in serve mode (the static engine's tokens, preempted mid-generation), passes
the account test and appears in the docs tables.

Its rule, from the method not the code: each pair's score is the attention the newest 8 queries give it (their
softmax over the pairs each query could see, averaged over the 8, then over the query heads of its KV group);
that is the reference's "snapkv" rule with a 1-pair kernel and the window's own pairs scored too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from kvbench import policies
from kvbench.policies.policy import Needs, Policy, ScoreContext
from tests import reference as R
from tests.memory import test_account_registry as account
from tests.policies.test_scored import PROMPTS, assert_traces_match, reference, run_engine
from tests.serve.test_engine import assert_preempted_serve_is_static


@dataclass
class LastQueries(Policy):
    """A throwaway policy, as a newcomer adds one: the attention of the newest 8 queries."""

    kv_size: int | None = 32
    evict_every: int = 8
    name: ClassVar[str] = "zz_last_queries"
    summary: ClassVar[str] = "attention of the newest 8 queries"
    paper: ClassVar[None] = None
    needs: ClassVar[Needs] = Needs(keys=True, queries=8)

    def score(self, ctx: ScoreContext) -> torch.Tensor:
        q, k = ctx.queries, ctx.keys  # (L, B, H_q, 8, D), (L, B, H, N, D)
        H, N = k.shape[2], k.shape[3]
        G = q.shape[2] // H
        q = q.reshape(*q.shape[:2], H, G * q.shape[3], q.shape[4])  # (L, B, H, G*8, D)
        logits = (q @ k.transpose(-1, -2)).float() * ctx.scale  # (L, B, H, G*8, N)
        qpos = ctx.query_pos.repeat(1, 1, 1, G)[..., None]  # (1, B, 1, G*8, 1), as q's rows
        seen = (ctx.pos[..., None, :] <= qpos) & (torch.arange(N, device=k.device) < ctx.n[..., None])
        w = logits.masked_fill(~seen, float("-inf")).softmax(-1).nan_to_num(0.0)  # empty window entries: 0
        return w.sum(-2) / (8 * G)  # (L, B, H, N): the mean over the 8 queries and the group


def _reference_spec(policy) -> R.Spec:
    return R.Spec(rule="snapkv", kv_size=policy.kv_size, evict_every=policy.evict_every, schedule=policy.schedule,
                  window=8, kernel=1, pooling="avg", pool_window=True)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(policies._REGISTRY, LastQueries.name, LastQueries)
    return LastQueries


@pytest.mark.parametrize("schedule", ["decode_only", "after_prefill"])
def test_static_mode_keeps_what_the_rule_keeps(registered, tiny_llama, schedule):
    policy = registered(schedule=schedule)
    refs = [reference("llama", tuple(p), _reference_spec(policy)) for p in PROMPTS]
    assert_traces_match(refs, *run_engine(tiny_llama, PROMPTS, policy, 4)[:3])


def test_serve_mode_gives_the_static_engines_tokens(registered, tiny_llama, monkeypatch):
    assert_preempted_serve_is_static(tiny_llama, registered(kv_size=8, evict_every=1, schedule="after_prefill"),
                                     monkeypatch)


def test_account_follows_its_declaration(registered, tiny_llama, monkeypatch):
    monkeypatch.setattr(account, "_at_test_size", lambda name: registered())
    account.check_account(registered.name, tiny_llama, monkeypatch)
    account.test_serve_pool_and_query_windows_are_what_the_declaration_charges(registered.name, tiny_llama, monkeypatch)
