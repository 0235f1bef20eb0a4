"""Cache rotation in serve mode (`policy.rerotate=true`, OpenVINO GenAI's cache rotation): after whole blocks
are evicted, every kept key of the request equals layer 0's key of its token computed afresh at its logical
slot (tiny Llama, float64), before every forward; without rotation keys stay at their source positions."""

from __future__ import annotations

import pytest
import torch

from kvbench.policies import H2O, BatchMax, Window
from kvbench.serve import model_runner as runner_mod
from kvbench.serve.engine import serve
from kvbench.serve.request import Request
from tests.cache.test_rotate import fresh_keys
from tests.conftest import random_prompts


def run(lm, policy, monkeypatch):
    errors = {"slot": 0.0, "source": 0.0}
    evicted = []
    step = runner_mod.ModelRunner.step

    @torch.no_grad()
    def checked(self, scheduled):
        for s in scheduled:
            r = s.req
            evicted.append(r.evicted_blocks)
            if r.n_slots == 0:
                continue
            slots = self.pool.slots(r.pages, r.held)[0][0]  # (H, N): layer 0's pages, each KV head its own
            seq = torch.tensor(r.prompt + r.output)
            src = self.pool.pos[slots[0]]
            assert torch.equal(self.pool.pos[slots], src.expand(slots.shape))  # every head holds the same pairs
            K = self.pool.k[slots]  # (H, N, D)
            for name, at in (("slot", torch.arange(slots.shape[-1])), ("source", src)):
                err = float((K - fresh_keys(lm.model, seq[src], at)).abs().max())
                errors[name] = max(errors[name], err)
        return step(self, scheduled)

    monkeypatch.setattr(runner_mod.ModelRunner, "step", checked)
    reqs = [Request(rid=i, prompt=p, max_new_tokens=12) for i, p in enumerate(random_prompts((45, 30, 60), seed=9))]
    serve(lm.model, reqs, policy, num_blocks=64, block_size=4, max_tokens_per_step=24)
    return errors, max(evicted), [r.output for r in reqs]


@pytest.mark.parametrize("policy", [Window(kv_size=24, evict_every=4, protect_first=4, rerotate=True),
                                    BatchMax(kv_size=24, evict_every=4, rerotate=True),
                                    H2O(kv_size=24, evict_every=4, protect_recent=8, rerotate=True)],
                         ids=lambda p: f"{p.name}-{p.schedule}")
def test_rotated_keys_equal_keys_at_their_slots(tiny_llama, policy, monkeypatch):
    errors, evicted, _ = run(tiny_llama, policy, monkeypatch)
    assert evicted > 0
    assert errors["slot"] < 1e-5, errors  # float32 RoPE frequencies, one rotation from the written key
    assert errors["source"] > 1e-2, errors  # the comparison can fail


def test_without_rotation_keys_keep_their_source_positions(tiny_llama, monkeypatch):
    errors, evicted, plain = run(tiny_llama, BatchMax(kv_size=24, evict_every=4), monkeypatch)
    assert evicted > 0 and errors["source"] < 1e-9, errors
    _, _, rotated = run(tiny_llama, BatchMax(kv_size=24, evict_every=4, rerotate=True), monkeypatch)
    assert rotated != plain
