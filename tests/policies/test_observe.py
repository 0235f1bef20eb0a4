"""The observe step (kvbench.policies.needs): a policy that declares `hidden`, `module`, per-pair and per-row state
sees, at every layer of every forward (prefill chunks, decode steps; static and serve mode), the layer's input hidden
states (checked: the module's pre-RoPE queries of them, rotated at the observation's positions by the model's rotary
embedding, are the queries attention computed, kvbench.models.prerope), and its own state follows the pairs (a
pair's statistic stored at arrival is read back with that pair after any eviction) and the rows (a running count of
the real tokens observed is each row's count of processed tokens). Serve mode, preempted, gives the static tokens;
the account charges the declared state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from kvbench import policies
from kvbench.models import prerope
from kvbench.policies.policy import Needs, Policy, ScoreContext
from tests.conftest import random_prompts
from tests.memory import test_account_registry as account
from tests.policies.test_scored import run_engine
from tests.serve.test_engine import assert_preempted_serve_is_static

ERRORS: list[float] = []
SCORED: list[int] = []


@dataclass
class Arrival(Policy):
    """Keeps the pairs whose hidden state had the largest norm; checks what it observes."""

    kv_size: int | None = 32
    evict_every: int = 8
    name: ClassVar[str] = "zz_arrival"
    summary: ClassVar[str] = "largest input hidden-state norm"
    needs: ClassVar[Needs] = Needs(hidden=True, module=True, pair_state=("arrival", "hnorm"),
                                   row_state=(("count", (1,)), ("qsum", ("Hq", "D"))))

    def observe(self, obs):
        q = prerope.queries(obs.module, obs.hidden)  # (B, Hq, T, D)
        cos, sin = prerope.cos_sin(obs.rotary, obs.positions, q)
        q = prerope.rotate(q, cos[:, None], sin[:, None])
        real = obs.real[:, None, :, None].expand_as(q)
        if bool(real.any()):
            ERRORS.append(float((q - obs.query)[real].abs().max()))
        obs.state["count"] += obs.real.sum(1, keepdim=True).float()
        obs.state["qsum"] += (q * obs.real[:, None, :, None]).sum(2).float()
        B, H, T = obs.key.shape[:3]
        return {"arrival": obs.positions.float()[:, None].expand(B, H, T),
                "hnorm": obs.hidden.float().norm(dim=-1)[:, None].expand(B, H, T)}

    def observe_bytes(self, *, rows, tokens, q_heads, kv_heads, head_dim, hidden, elem) -> int:
        return 12 * rows * q_heads * tokens * head_dim * 4 + 4 * rows * tokens * head_dim * 4  # its check included

    def score(self, ctx: ScoreContext) -> torch.Tensor:
        held = torch.arange(ctx.pos.shape[-1], device=ctx.pos.device) < ctx.n
        assert torch.equal(ctx.pair["arrival"][held.expand_as(ctx.pos)], ctx.pos.float()[held.expand_as(ctx.pos)])
        assert torch.equal(ctx.state["count"][..., 0], (ctx.last[0, :, 0, 0] + 1).float().expand(ctx.pos.shape[0], -1))
        assert ctx.modules is not None and len(ctx.modules) == ctx.pos.shape[0] and ctx.rotary is not None
        SCORED.append(1)
        return ctx.pair["hnorm"]


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(policies._REGISTRY, Arrival.name, Arrival)
    ERRORS.clear()
    SCORED.clear()
    return Arrival


@pytest.mark.parametrize("schedule", ["prefill_and_decode", "decode_only", "after_prefill"])
def test_static_observes_hidden_states_and_keeps_its_state_with_the_pairs(registered, tiny_llama, schedule):
    prompts = random_prompts((40, 29, 51), seed=5)
    run_engine(tiny_llama, prompts, registered(schedule=schedule), 3, prefill_chunk=16)
    assert ERRORS and max(ERRORS) < 1e-5 and SCORED


def test_serve_mode_gives_the_static_engines_tokens(registered, tiny_llama, monkeypatch):
    assert_preempted_serve_is_static(tiny_llama, registered(kv_size=8, evict_every=1, schedule="after_prefill"),
                                     monkeypatch)
    assert ERRORS and max(ERRORS) < 1e-5 and SCORED


def test_account_charges_the_declared_state(registered, tiny_llama, monkeypatch):
    monkeypatch.setattr(account, "_at_test_size", lambda name: registered())
    account.check_account(registered.name, tiny_llama, monkeypatch)
    account.test_serve_pool_and_query_windows_are_what_the_declaration_charges(registered.name, tiny_llama, monkeypatch)
