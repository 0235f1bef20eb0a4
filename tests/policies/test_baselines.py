"""The baselines (Knorm, KeyDiff, random, StreamingLLM, SnapKV, faithful TOVA) against the brute-force
reference of tests/reference.py, under both schedules, at batch 1 and per sample of a left-padded
batch of 4 (prompts of different lengths), on tiny Llama (GQA) and tiny Phi-3.

Guards that the comparisons can fail: the rules keep different pairs from each other and from a
sliding window, SnapKV's pooling and window matter, random's seed matters, and faithful TOVA's heads
hold the same positions while the per-KV-head variant's do not.
"""

from __future__ import annotations

import pytest
import torch

from kvbench import budgets as B
from kvbench.policies import TOVA, KeyDiff, Knorm, Random, SnapKV, StreamingLLM
from kvbench.policies.random import mix
from tests import reference as R
from tests.conftest import random_prompts
from tests.policies.test_scored import (
    NEW,
    PROMPTS,
    assert_engine_matches_reference,
    pid,
    reference,
    run_engine,
    spec_of,
)

BASELINES = [
    Knorm(kv_size=32, evict_every=8),  # decode_only
    Knorm(kv_size=32, evict_every=8, schedule="prefill_and_decode"),
    KeyDiff(kv_size=32, evict_every=8),
    KeyDiff(kv_size=24, evict_every=4, schedule="prefill_and_decode", protect_first=2),
    Random(kv_size=32, evict_every=8, seed=3),
    Random(kv_size=32, evict_every=8, schedule="prefill_and_decode"),
    StreamingLLM(kv_size=32, evict_every=8),  # prefill_and_decode, 4 sinks
    StreamingLLM(kv_size=24, evict_every=1, schedule="decode_only"),
    SnapKV(kv_size=32, evict_every=8, window=8),  # decode_only, max pooling, window protected
    SnapKV(kv_size=32, evict_every=8, window=6, pooling="avg", kernel=5, schedule="prefill_and_decode"),
    SnapKV(kv_size=32, evict_every=4, window=12, protect_recent=2, schedule="prefill_and_decode"),  # window > p
]


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("policy", BASELINES, ids=pid)
@pytest.mark.parametrize("arch", ["llama", "phi3"])
def test_baseline_matches_reference(arch, policy, batch_size, request):
    assert_engine_matches_reference(request.getfixturevalue(f"tiny_{arch}"), arch, policy, batch_size)


@pytest.mark.parametrize("chunk", [5, 3])
def test_snapkv_window_across_chunked_forwards(tiny_llama, chunk):
    """The query window spans several forwards (prefill chunks of 3-5 tokens, one-token decode steps)."""
    policy = BASELINES[10]
    refs = [reference("llama", tuple(p), spec_of(policy)) for p in PROMPTS]
    tokens, evictions, final, _ = run_engine(tiny_llama, PROMPTS, policy, 4, prefill_chunk=chunk)
    assert evictions == [r.evictions for r in refs]
    assert final == [r.final for r in refs] and tokens == [r.tokens for r in refs]


def _kept(spec, prompt=PROMPTS[0], arch="llama"):
    return [k for _, k in reference(arch, tuple(prompt), spec).evictions]


def test_rules_are_discriminative():
    """Each rule keeps something different from the others and from a plain window; heads differ."""
    base = dict(kv_size=32, evict_every=8, schedule="decode_only")
    specs = {r: R.Spec(r, **base, window=8 if r == "snapkv" else 0) for r in ("knorm", "keydiff", "random", "snapkv")}
    specs["newest"] = R.Spec("newest", **base)
    kept = {r: _kept(s) for r, s in specs.items()}
    assert len({str(k) for k in kept.values()}) == len(kept)
    for r in ("knorm", "keydiff", "random", "snapkv"):
        assert any(h != heads[0] for ev in kept[r] for heads in ev for h in heads), r  # heads choose differently
    # SnapKV's options matter: pooling, kernel and window each change what is kept
    snap = R.Spec("snapkv", **base, window=8)
    variants = [snap, R.Spec("snapkv", **base, window=8, pooling="avg"), R.Spec("snapkv", **base, window=8, kernel=1),
                R.Spec("snapkv", **base, window=3)]
    assert len({str(_kept(v)) for v in variants}) == len(variants)


def test_streaming_llm_keeps_sinks_and_the_newest(tiny_llama):
    """StreamingLLM = the 4 first positions + the most recent ones, in every head."""
    policy = BASELINES[6]
    _, evictions, _, _ = run_engine(tiny_llama, PROMPTS, policy, 4)
    for b in range(len(PROMPTS)):
        assert evictions[b]
        for seen, kept in evictions[b]:
            want = [0, 1, 2, 3] + list(range(seen - (B.keep(policy, policy.kv_size) - 4), seen))
            assert all(h == want for heads in kept for h in heads)
    assert StreamingLLM().protect_first == 4 and StreamingLLM().name == "streaming_llm"


def test_random_is_seeded_and_uniform(tiny_llama):
    """The same seed keeps the same pairs at batch 1 and 4; another seed keeps others; draws look uniform."""
    a = run_engine(tiny_llama, PROMPTS, Random(kv_size=32, evict_every=8, seed=1), 1)[1]
    b = run_engine(tiny_llama, PROMPTS, Random(kv_size=32, evict_every=8, seed=1), 4)[1]
    c = run_engine(tiny_llama, PROMPTS, Random(kv_size=32, evict_every=8, seed=2), 4)[1]
    assert a == b and a != c
    x = mix(torch.arange(200_000, dtype=torch.long)) >> 7
    u = x.double() / 2**24
    assert 0 <= float(u.min()) and float(u.max()) < 1
    hist = torch.histc(u, bins=10, min=0, max=1)
    assert float((hist / hist.mean() - 1).abs().max()) < 0.02  # uniform within 2% per decile
    assert [R.random_score(5, 1, 0, 40, p) for p in range(30)] != sorted(R.random_score(5, 1, 0, 40, p) for p in range(30))


@pytest.mark.parametrize("schedule", ["decode_only", "prefill_and_decode"])
def test_faithful_tova_evicts_the_same_positions_from_every_head(tiny_llama, schedule):
    kw = dict(kv_size=32, evict_every=4, schedule=schedule)
    _, same, _, _ = run_engine(tiny_llama, PROMPTS, TOVA(**kw), 4)
    _, per_head, _, _ = run_engine(tiny_llama, PROMPTS, TOVA(**kw, per_kv_head=True), 4)
    assert all(h == heads[0] for ev in same for _, kept in ev for heads in kept for h in heads)
    assert any(h != heads[0] for ev in per_head for _, kept in ev for heads in kept for h in heads)
    assert TOVA(per_kv_head=True).describe()["extensions"] and not TOVA().describe()["extensions"]


def test_knorm_keeps_the_lowest_norms():
    """Scores straight from keys: the kept keys of every head have lower norms than the evicted ones."""
    from kvbench.cache import KVCache

    B, H, D, T, keep = 2, 3, 8, 20, 12
    cache = KVCache(batch_size=B, num_kv_heads=H, head_dim=D, capacity=T, dtype=torch.float32, layer_devices=["cpu"])
    cache.begin_forward(torch.tensor([T, 16]), T)
    k = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(0))  # (B, H_kv, T, D)
    cache.write(0, k, k)
    cache.evict(torch.ones(B, dtype=torch.bool), keep, Knorm(kv_size=16, evict_every=4))
    for b, n in enumerate((T, 16)):
        norms = k[b, :, T - n :].norm(dim=-1)  # sample b's n real tokens are right-aligned in the chunk
        for h in range(H):
            kept = cache.kept_positions(0, b)[h]
            gone = sorted(set(range(n)) - set(kept.tolist()))
            assert norms[h, kept].max() < norms[h, gone].min()


def test_baselines_run_under_both_schedules_at_batch_4_within_budget(tiny_phi3):
    """Short prompts, left padding, every baseline and schedule: never more than kv_size pairs once evicting."""
    prompts = random_prompts((50, 9, 33, 61), seed=11)
    for cls in (Knorm, KeyDiff, Random, SnapKV, StreamingLLM, TOVA):
        for schedule in ("prefill_and_decode", "decode_only"):
            kw = dict(window=4) if cls is SnapKV else {}
            policy = cls(kv_size=24, evict_every=4, schedule=schedule, **kw)
            tokens, _, _, peak = run_engine(tiny_phi3, prompts, policy, 4, new=NEW)
            assert all(len(t) == NEW for t in tokens)
            assert peak <= (24 if schedule == "prefill_and_decode" else max(map(len, prompts)))
