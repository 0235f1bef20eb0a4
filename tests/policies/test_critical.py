"""CriticalKV against the brute-force rules: over ExpectedAttention (use_vnorm off) at compression_ratio 0.5 against
tests/reference_generate.py's `critical_expected_attention` (proven against kvpress 0.5.5's CriticalKVPress), and
over SnapKV at kv_size against tests/reference.py's "critical", each in one left-padded batch (kept pairs and
tokens); its first-stage count (kvpress's) and what it refuses."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvbench.engine import generate
from kvbench.errors import ConfigError
from kvbench.policies import Critical
from tests import reference_generate as G
from tests.policies.test_scored import (
    NEW,
    PROMPTS,
    _ref_model,
    assert_traces_match,
    reference,
    run_engine,
    spec_of,
)


def test_over_expected_attention_keeps_the_kvpress_rules_pairs_and_tokens_at_batch_4(tiny_llama):
    policy = Critical(compression_ratio=0.5, inner="expected_attention", inner_args={"use_vnorm": False})
    kept = []

    def observer(event, cache):
        if event == "evict":
            kept.append([[[[p for p in h if p >= 0] for h in cache.kept_positions(la, b).tolist()]
                          for la in range(cache.num_layers)] for b in range(len(PROMPTS))])

    out = generate(tiny_llama.model, tiny_llama.tokenizer, PROMPTS, policy, len(PROMPTS), max_new_tokens=NEW,
                   eos_token_ids=[], observer=observer)
    assert len(kept) == 1
    for b, p in enumerate(PROMPTS):
        tokens, want = G.generate(_ref_model("llama"), p, NEW, "critical_expected_attention", 0.5)
        assert kept[0][b] == want, b
        assert out.token_ids[b] == tokens, b


def test_over_snapkv_keeps_the_rules_pairs_and_tokens_at_batch_4(tiny_llama):
    policy = Critical(kv_size=32, inner_args={"window": 8})  # prompts 70, 24, 45, 13: two compress
    refs = [reference("llama", tuple(p), spec_of(policy)) for p in PROMPTS]
    snap = reference("llama", tuple(PROMPTS[0]), dataclasses.replace(spec_of(policy), rule="snapkv"))
    assert refs[0].final != snap.final  # the rescaling changes what SnapKV alone keeps
    assert_traces_match(refs, *run_engine(tiny_llama, PROMPTS, policy, 4)[:3])


def test_first_stage_is_kvpress_count():
    n = torch.tensor([1000, 13, 1, 7]).view(1, 4, 1, 1)
    for r in (0.25, 0.5, 0.75):
        got = Critical(compression_ratio=r).first_stage(n).flatten().tolist()
        assert got == [max(1, int((1 - r) * k * 0.5)) for k in (1000, 13, 1, 7)]
    assert Critical(kv_size=33).first_stage(n).flatten().tolist() == [16] * 4


@pytest.mark.parametrize("keys", [{"schedule": "decode_only"}, {"schedule": "prefill_and_decode"},
                                  {"head_budget": "adaptive"}, {"inner": "chunkkv"}, {"inner": "critical"},
                                  {"inner": "pyramidkv"}, {"inner_args": {"nope": 1}}, {"first_stage_ratio": 2}])
def test_refusals_name_their_key(keys):
    with pytest.raises(ConfigError) as e:
        Critical(**keys)
    assert e.value.key == f"policy.{next(iter(keys))}"


@pytest.mark.parametrize("inner", ["snapkv", "expected_attention"])
def test_bfloat16_keeps_what_the_same_weights_keep_in_float64(inner):
    """A bfloat16 model's kept sets against the same weights run in float64 (the score's products and norms taken
    in float32 from bfloat16 values): nearly the same pairs in every (layer, head, sample), and finite scores."""
    import copy

    from kvbench.models import build_tiny

    bf16 = build_tiny("tiny-llama", arch="llama", dtype="bfloat16", device="cpu")
    f64 = copy.deepcopy(bf16.model).double()
    policy = Critical(compression_ratio=0.5, inner=inner)
    kept = {}
    for name, model in (("bf16", bf16.model), ("f64", f64)):
        seen = []

        def observer(event, cache, seen=seen):
            if event == "evict":
                seen.append([set(p for p in h if p >= 0) for la in range(cache.num_layers)
                             for b in range(len(PROMPTS)) for h in cache.kept_positions(la, b).tolist()])

        generate(model, bf16.tokenizer, PROMPTS, policy, len(PROMPTS), max_new_tokens=2, eos_token_ids=[],
                 observer=observer)
        kept[name] = seen[0]
    jaccard = [len(a & b) / len(a | b) for a, b in zip(kept["bf16"], kept["f64"], strict=True)]
    assert sum(jaccard) / len(jaccard) > 0.9 and min(jaccard) > 0.6, (sum(jaccard) / len(jaccard), min(jaccard))


@pytest.mark.parametrize("wrapper", ["critical", "chunkkv"])
def test_a_wrapper_inherits_its_inner_policys_refusals(wrapper, monkeypatch):
    """Over Compactor (scored in the prompt's one forward), CriticalKV and ChunkKV are refused gen.prefill_chunk as
    Compactor is, and serve mode feeds their prompts whole (else a prompt split over steps gets other tokens than the
    static engine's); the inner policy's check of the model runs too (issue 58)."""
    from kvbench.config import prepare
    from kvbench.policies import ChunkKV, Compactor
    from kvbench.serve.block_evict import BlockRule
    from tests.memory.test_account import _compose

    cfg = _compose("model=tiny-llama", f"policy={wrapper}", "policy.inner=compactor", "gen.prefill_chunk=64")
    with pytest.raises(ConfigError) as refused:
        prepare(cfg)
    assert refused.value.key == "gen.prefill_chunk" and "policy.inner=compactor" in str(refused.value)
    cls = Critical if wrapper == "critical" else ChunkKV
    assert BlockRule.of(cls(inner="compactor"), 4).whole_prompt
    assert not BlockRule.of(cls(), 4).whole_prompt and cls.whole_prompt is None  # over SnapKV: chunks are fine

    def refuse(self, config):
        raise ConfigError("policy.inner", "not on this model")

    monkeypatch.setattr(Compactor, "check_model", refuse)
    with pytest.raises(ConfigError, match="not on this model"):
        cls(inner="compactor").check_model(None)
