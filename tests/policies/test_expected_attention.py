"""ExpectedAttention (kvbench.policies.expected_attention) against kvpress 0.5.5 and the brute-force rule
(tests/reference_methods.expected_attention through tests/reference_generate): after_prefill keeps kvpress's pairs
and decodes its tokens on kvpress's tiny model (per-head topk, and AdaKV at head_floor 0.2 with epsilon 1e-2); a
batch with left padding keeps, row by row, what each prompt alone keeps under the rule; the running statistics
merged chunk by chunk (Chan's formula) are the statistics of all the queries at once."""

from __future__ import annotations

import functools
import types
from typing import ClassVar

import pytest
import torch

from kvbench.attention import kv_attention
from kvbench.engine import generate
from kvbench.models import prerope
from kvbench.models.tiny import FAMILY_ARCHS
from kvbench.policies.compactor import Compactor
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


# --------------------------------------------------------------- each family's RoPE (partial, interleaved, NoPE)


def _phi4_mini_shape():
    """A tiny Phi-3 with Phi-4-mini's partial rotary factor 0.75 (12 of 16 dims rotate) and no window."""
    from transformers import AutoModelForCausalLM

    from kvbench.models.tiny import byte_tokenizer, tiny_config

    cfg = tiny_config("phi3")
    cfg.rope_parameters = {**cfg.rope_parameters, "partial_rotary_factor": 0.75}
    torch.manual_seed(0)
    return types.SimpleNamespace(model=AutoModelForCausalLM.from_config(cfg).eval(), tokenizer=byte_tokenizer())


def _check_rope(obs, errors: list) -> None:
    """That the layer's RoPE matrix (kvbench.models.prerope.rotation at the forward's positions) turns the pre-RoPE
    queries and keys into those the model's attention computed (max abs error over the real positions)."""
    cos, sin = prerope.cos_sin(obs.rotary, obs.positions, obs.hidden.float(), obs.module)  # (B, T, C)
    R = prerope.rotation(obs.module, cos, sin)[:, None]  # (B, 1, T, D, D)
    real = obs.real[:, None, :, None]
    for pre, post in ((prerope.queries(obs.module, obs.hidden), obs.query),
                      (prerope.keys(obs.module, obs.hidden), obs.key)):
        rotated = (R @ pre.float()[..., None])[..., 0]  # (B, H, T, D)
        errors.append(float(((rotated - post.float()) * real).abs().max()))


class RopeCheck(ExpectedAttention):
    """ExpectedAttention that also checks each layer's RoPE matrix at every layer of every forward."""

    errors: ClassVar[list] = []

    def observe(self, obs):
        _check_rope(obs, self.errors)
        return super().observe(obs)


class CompactorRopeCheck(Compactor):
    """Compactor (its pre-RoPE keys) with the same check: it runs where layers differ in shape (Gemma 4)."""

    errors: ClassVar[list] = RopeCheck.errors

    def observe(self, obs):
        _check_rope(obs, self.errors)
        return super().observe(obs)


ROPE_ARCHS = [a for a in FAMILY_ARCHS if a not in ("gemma3-bidirectional", "gemma4", "ministral3")]


@pytest.mark.parametrize("arch", ["llama", "phi4-mini-shape", *ROPE_ARCHS, "gemma4"])
def test_each_layer_s_rope_matrix_is_the_model_s(arch):
    """Full, partial (GLM-4 0.5 interleaved, Phi-4-mini 0.75, Qwen3.5 0.25, Gemma 4's global layers), interleaved
    (Cohere), halved (gpt-oss), per-layer-type (Gemma 3) and NoPE layers (SmolLM3, EXAONE 4): R q_pre is the query the
    attention computed, R k_pre the key, at every position (Ministral 3 also scales its queries by position, which R
    leaves out). Gemma 4 (layers of two shapes, refused to ExpectedAttention) through Compactor's pre-RoPE keys."""
    from tests.models.test_family import model

    lm = _phi4_mini_shape() if arch == "phi4-mini-shape" else model(arch)
    RopeCheck.errors.clear()
    policy = CompactorRopeCheck(kv_size=12) if arch == "gemma4" else RopeCheck(kv_size=12)
    out = generate(lm.model, lm.tokenizer, [T.prompt_ids(40, seed=1), T.prompt_ids(29, seed=4)],
                   policy, 2, max_new_tokens=3, eos_token_ids=[], prefill_chunk=16)
    assert all(len(t) == 3 for t in out.token_ids)
    assert RopeCheck.errors and max(RopeCheck.errors) < 1e-4, arch


@pytest.mark.parametrize("arch", ["llama", "glm4", "qwen3.5", "cohere", "gpt-oss"])
def test_the_averaged_rope_is_the_mean_of_the_matrices_and_kvpress_s_on_full_rope(arch):
    """ExpectedAttention's R (the mean over the next 512 positions) is the mean of the per-position matrices; with
    RoPE over every dim in rotate-half pairs (Llama) it is kvpress's diag(cos) + diag(sin) P."""
    from kvbench.attention import attention_modules
    from tests.models.test_family import model

    m = model(arch).model
    module = next(a for a in attention_modules(m) if a is not None)
    rotary = m.get_decoder().rotary_emb
    t = torch.tensor([[37], [100]]) + torch.arange(512)  # (B, F)
    R = ExpectedAttention.mean_rotation(rotary, module, t)  # (B, D, D)
    cos, sin = prerope.cos_sin(rotary, t, torch.zeros(1), module)
    torch.testing.assert_close(R, prerope.rotation(module, cos, sin).mean(1), rtol=1e-5, atol=1e-6)
    if arch == "llama":
        D = module.head_dim
        P = torch.zeros(D, D)
        P[D // 2:, :D // 2], P[:D // 2, D // 2:] = torch.eye(D // 2), -torch.eye(D // 2)
        assert torch.equal(R, torch.diag_embed(cos.mean(1)) + sin.mean(1)[:, :, None] * P)
