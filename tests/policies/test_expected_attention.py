"""ExpectedAttention (kvbench.policies.expected_attention) against kvpress 0.5.5 and the brute-force rule
(tests/reference_methods.expected_attention through tests/reference_generate): after_prefill keeps kvpress's pairs
and decodes its tokens on kvpress's tiny model (per-head topk, and AdaKV at head_floor 0.2 with epsilon 1e-2); a
batch with left padding keeps, row by row, what each prompt alone keeps under the rule; the running statistics
merged chunk by chunk (Chan's formula) are the statistics of all the queries at once."""

from __future__ import annotations

import functools

import pytest
import torch

from kvbench.attention import kv_attention
from kvbench.engine import generate
from kvbench.models import prerope
from kvbench.policies.expected_attention import ExpectedAttention
from kvbench.policies.needs import Observation
from tests import kvpress_tiny as T
from tests import reference as R
from tests import reference_generate as G
from tests.policies.test_reference_methods import fixture
from tests.policies.test_scored import PerSample


@functools.cache
def tiny(dtype=torch.float64):
    return T.tiny_model(dtype)


def run(model, prompts, policy, new):
    obs = PerSample(len(prompts))
    with kv_attention(model, hidden=True):
        out = generate(model, T.CharTokenizer(), prompts, policy, len(prompts), max_new_tokens=new, eos_token_ids=[],
                       observer=obs)
    holes = lambda kept: [[[p for p in head if p >= 0] for head in layer] for layer in kept]  # noqa: E731 (adaptive)
    return out.token_ids, [holes(ev[0][1]) for ev in obs.evictions]


@pytest.mark.parametrize("name,kw", [("expected_attention", {}),
                                     ("adakv_expected_attention", dict(head_budget="adaptive", head_floor=0.2,
                                                                       epsilon=1e-2))])
def test_after_prefill_keeps_kvpress_pairs_and_tokens(name, kw):
    fx = fixture(name)
    policy = ExpectedAttention(kv_size=None, compression_ratio=fx["ratio"], schedule="after_prefill", **kw)
    tokens, kept = run(tiny(), [fx["ids"]], policy, len(fx["tokens"]))
    assert kept[0] == fx["kept"]
    assert tokens[0] == fx["tokens"]


def test_left_padded_batch_keeps_the_rule_row_by_row():
    model = tiny()
    prompts = [T.prompt_ids(40, seed=1), T.prompt_ids(27, seed=4), T.prompt_ids(33, seed=7)]
    policy = ExpectedAttention(kv_size=None, compression_ratio=0.5, schedule="after_prefill")
    tokens, kept = run(model, prompts, policy, 4)
    ref = R.ReferenceModel(model)
    for ids, tok, k in zip(prompts, tokens, kept, strict=True):
        want_tokens, want_kept = G.generate(ref, ids, 4, "expected_attention", 0.5)
        assert k == want_kept and tok == want_tokens


def test_statistics_merged_chunk_by_chunk_are_all_queries_at_once():
    model = tiny(torch.float32)
    module = model.model.layers[0].self_attn
    B, S = 2, 23
    hidden = torch.randn(B, S, model.config.hidden_size)
    policy = ExpectedAttention()
    shapes = policy.needs.row_shapes(model.config.num_attention_heads, model.config.num_key_value_heads,
                                     module.head_dim)
    state = {n: torch.zeros(B, *s) for n, s in shapes.items()}
    pos = torch.arange(S)[None].expand(B, S)
    real = pos >= torch.tensor([[0], [5]])  # row 1: 5 pads on the left
    for a, b in [(0, 3), (3, 10), (10, 11), (11, S)]:
        policy.observe(Observation(layer=0, module=module, hidden=hidden[:, a:b], positions=pos[:, a:b],
                                   real=real[:, a:b], query=None, key=torch.zeros(B, 1, b - a, 1), value=None,
                                   scaling=1.0, state=state))
    q = prerope.queries(module, hidden).float()  # (B, Hq, S, D)
    for row in range(B):
        use = real[row] & (pos[row] >= policy.n_sink)
        x = q[row][:, use]  # (Hq, n, D)
        mu = x.mean(1)
        cov = (x - mu[:, None]).transpose(1, 2) @ (x - mu[:, None]) / x.shape[1]
        assert state["count"][row, 0] == x.shape[1]
        torch.testing.assert_close(state["mean"][row], mu, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(state["m2"][row] / x.shape[1], cov, rtol=1e-4, atol=1e-5)
