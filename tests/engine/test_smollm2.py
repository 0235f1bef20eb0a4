"""Batch-Max on the real default model (SmolLM2-135M-Instruct, float32 on the CPU); slow tests.

* With a budget that never forces an eviction (kv_size >= prompt + new tokens - 1: the cache holds
  at most that many pairs at the last forward) batch_max reproduces the full cache token for token,
  scores being collected all along. With kv_size equal to the prompt length the whole prompt is
  prefilled without eviction, so the first token must equal full's (later tokens may differ: the
  cache is full at the first decode step and evicts p pairs).
* With kv_size at half the prompt it runs at batch size 8, never holds more than kv_size pairs per
  head (measured from the cache after every forward and eviction), and its peak KV bytes are
  2 * layers * kv_heads * head_dim * kv_size * bytes * batch.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from kvbench.engine import generate
from kvbench.policies import BatchMax, Full
from tests.conftest import load_smollm2

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lm():
    return load_smollm2()


def text_prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    """n different prompts of exactly `length` tokens of real text (Python stdlib sources)."""
    import json
    import logging

    ids = tokenizer(inspect.getsource(logging) + inspect.getsource(json), add_special_tokens=False)["input_ids"]
    out = [ids[i * 700 : i * 700 + length] for i in range(n)]
    assert all(len(x) == length for x in out)
    return out


def test_batch_max_with_room_reproduces_full(lm):
    prompts = text_prompts(lm.tokenizer, 4, 160)
    new = 24
    full = generate(lm.model, lm.tokenizer, prompts, Full(), 4, max_new_tokens=new, ignore_eos=True)
    roomy = BatchMax(kv_size=160 + new - 1, evict_every=16)
    out = generate(lm.model, lm.tokenizer, prompts, roomy, 4, max_new_tokens=new, ignore_eos=True)
    assert out.token_ids == full.token_ids
    assert len(set(map(tuple, full.token_ids))) == 4  # different prompts, different outputs

    evictions = []
    at_prompt = BatchMax(kv_size=160, evict_every=16)
    obs = lambda event, cache: evictions.append(int(cache.seen.min())) if event == "evict" else None  # noqa: E731
    tight = generate(lm.model, lm.tokenizer, prompts, at_prompt, 4, max_new_tokens=new, ignore_eos=True, observer=obs)
    assert evictions and min(evictions) == 160  # nothing evicted before the prompt was done
    assert [t[0] for t in tight.token_ids] == [t[0] for t in full.token_ids]


def test_half_prompt_budget_at_batch_8_peak_bytes(lm):
    B, s, kv, new = 8, 256, 128, 16
    prompts = text_prompts(lm.tokenizer, B, s)
    most = []
    obs = lambda event, cache: most.append(int(cache.n.max()))  # noqa: E731
    policy = BatchMax(kv_size=kv, evict_every=32)  # (s - kv) % p == 0: all 8 samples hold kv together
    out = generate(lm.model, lm.tokenizer, prompts, policy, B, max_new_tokens=new, ignore_eos=True, observer=obs)
    assert out.batches == 1 and all(len(t) == new for t in out.token_ids)
    assert max(most) == kv
    cfg = lm.model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    bytes_ = torch.empty((), dtype=lm.model.dtype).element_size()
    formula = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * kv * bytes_ * B
    assert out.peak_kv_bytes == formula
    assert (cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim, bytes_) == (30, 3, 64, 4)  # SmolLM2, float32
    full = generate(lm.model, lm.tokenizer, prompts[:1], Full(), 1, max_new_tokens=2, ignore_eos=True)
    assert full.peak_kv_bytes == formula // B * (s + 1) // kv  # the full cache holds the whole prompt (+1)


@pytest.mark.parametrize("schedule", ["prefill_and_decode", "decode_only"])
def test_baselines_on_smollm2_batch_4_left_padded_within_budgets(lm, schedule):
    """Every baseline, PyramidKV and a kv_ratio budget on the real model at batch 4 (prompts of different
    lengths, left-padded): each (layer, sample) holds at most its own budget at every forward (decode_only:
    once its prompt is compressed), and the outputs are full length."""
    from kvbench.policies import TOVA, KeyDiff, Knorm, PyramidKV, Random, SnapKV, StreamingLLM

    prompts = [p[:n] for p, n in zip(text_prompts(lm.tokenizer, 4, 200), (200, 90, 150, 120), strict=True)]
    policies = [SnapKV(kv_size=96, evict_every=16, schedule=schedule), PyramidKV(kv_size=96, evict_every=16,
                schedule=schedule), StreamingLLM(kv_size=96, evict_every=16), Knorm(kv_size=96, evict_every=16,
                schedule=schedule), KeyDiff(kv_size=96, evict_every=16, schedule=schedule),
                Random(kv_size=96, evict_every=16, schedule=schedule), TOVA(kv_size=96, evict_every=16, schedule=schedule),
                BatchMax(kv_ratio=0.5, evict_every=16, schedule=schedule)]
    for policy in policies:
        over = []

        def obs(event, cache, over=over, policy=policy):
            for g in cache.groups:
                if policy.schedule == "prefill_and_decode" or cache.evictions:
                    over.append(bool((g.n > g.budget).any()))

        out = generate(lm.model, lm.tokenizer, prompts, policy, 4, max_new_tokens=12, ignore_eos=True, observer=obs)
        assert all(len(t) == 12 for t in out.token_ids), policy.name
        assert over and not any(over), policy.name
