"""`policy.schedule=after_prefill` (kvpress's and SnapKV's protocol) and `policy.compression_ratio`
(kvpress's kept count): the prompt is compressed once, right after prefill, to int(s x (1 - ratio)) pairs
(or kv_size), and every generated token is kept. Against the brute-force reference (tests/reference.py,
its after_prefill written from that definition), per sample of a left-padded batch of 4, for every scored
policy and the per-layer budgets of PyramidKV; in the memory account and the planner's terms too."""

from __future__ import annotations

import pytest

from kvbench import budgets as B
from kvbench import memory
from kvbench.errors import ConfigError
from kvbench.policies import (
    H2O,
    TOVA,
    BatchMax,
    KeyDiff,
    Knorm,
    PyramidKV,
    Random,
    SnapKV,
    StreamingLLM,
    Window,
)
from tests.budgets.test_per_sample_and_layer import run
from tests.conftest import random_prompts
from tests.policies.test_scored import NEW, PROMPTS, assert_traces_match, reference, spec_of

AP = "after_prefill"
POLICIES = [
    BatchMax(compression_ratio=0.5, schedule=AP),
    H2O(compression_ratio=0.5, schedule=AP, protect_recent=4),
    TOVA(compression_ratio=0.6, schedule=AP),
    SnapKV(compression_ratio=0.5, schedule=AP, window=4, kernel=5, pooling="avg"),
    Knorm(compression_ratio=0.75, schedule=AP),
    KeyDiff(compression_ratio=0.5, schedule=AP),
    Random(compression_ratio=0.5, schedule=AP),
    StreamingLLM(compression_ratio=0.5, schedule=AP),
    Window(kv_size=12, schedule=AP),
    SnapKV(kv_size=16, schedule=AP, window=4),
]


def pid(p) -> str:
    return f"{p.name}-cr{p.compression_ratio}-kv{p.kv_size}"


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("policy", POLICIES, ids=pid)
def test_after_prefill_matches_reference_per_sample(tiny_llama, policy, batch_size):
    budgets = B.sample_budgets(policy, [len(p) for p in PROMPTS]).tolist()
    if policy.compression_ratio is not None:
        assert budgets == [int(len(p) * (1 - policy.compression_ratio)) for p in PROMPTS]  # kvpress's count
    refs = []
    for p, k in zip(PROMPTS, budgets, strict=True):
        spec = spec_of(policy)
        refs.append(reference("llama", tuple(p), type(spec)(**{**spec.__dict__, "kv_size": k})))
    tokens, evictions, final, held, out = run(tiny_llama, PROMPTS, policy, batch_size)
    assert_traces_match(refs, tokens, evictions, final)
    assert all(len(ev) <= 1 for ev in evictions)  # once, never again
    for ev, p, k in zip(evictions, PROMPTS, budgets, strict=True):
        assert (len(ev) == 1) == (len(p) > k)  # a prompt within its budget is left whole
        if ev:
            assert ev[0][0] == len(p) and all(len(h) == k for layer in ev[0][1] for h in layer)
            # (after the prompt, before the first decode forward; afterwards every generated token is kept)
    assert all(len(f[0][0]) == min(len(p), k) + NEW - 1 for f, p, k in zip(final, PROMPTS, budgets, strict=True))


def test_pyramidkv_after_prefill_per_layer(tiny_phi3):
    import tests.reference as R

    policy = PyramidKV(compression_ratio=0.5, schedule=AP, window=4, kernel=5, pooling="avg")
    prompts = random_prompts((60, 45, 70), seed=13)
    for p in prompts:
        ks = B.layer_budgets(policy, [len(p)], 2)[:, 0].tolist()
        spec = spec_of(policy)
        spec = R.Spec(**{**spec.__dict__, "kv_size": ks[0], "layer_kv": tuple(ks)})
        ref = reference("phi3", tuple(p), spec)
        tokens, evictions, final, _, _ = run(tiny_phi3, [p], policy, 1)
        assert_traces_match([ref], tokens, evictions, final)


def test_budgets_capacity_and_record_fields():
    p = Knorm(compression_ratio=0.75, schedule=AP, evict_every=64)
    assert p.kv_size is None and p.once and B.min_budget(p) == 1
    assert B.sample_budgets(p, [100, 7, 3]).tolist() == [25, 1, 1]
    budgets = B.layer_budgets(p, [100, 7], 3)
    assert B.capacities(p, [100, 7], 10, budgets) == [100] * 3  # the prompt first; then 25 + 10 fit
    assert B.decode_capacity(p, 25, 10) == 35
    assert p.describe()["extensions"] == ["compression_ratio=0.75: each sample keeps int(its prompt x 0.25) pairs "
                                          "(kvpress's count), at least 1"]  # the published schedule: no departure
    assert any("after_prefill" in e for e in H2O(kv_size=64, schedule=AP).describe()["extensions"])
    with pytest.raises(ConfigError, match="compression_ratio"):
        BatchMax(compression_ratio=1.0)
    with pytest.raises(ConfigError, match="compression_ratio"):
        BatchMax(compression_ratio=0.5, kv_ratio=0.5)


@pytest.mark.parametrize("policy", [Knorm(compression_ratio=0.5, schedule=AP), SnapKV(kv_size=24, schedule=AP, window=4),
                                    BatchMax(compression_ratio=0.5, schedule=AP)], ids=pid)
def test_account_matches_the_allocation(tiny_llama, policy):
    from kvbench.attention import kv_attention
    from kvbench.engine import generate_batch
    from tests.memory.test_account import AllocatedBytes

    lengths = (90, 70, 40)
    ids = random_prompts(lengths, seed=3)
    acc = memory.account(tiny_llama.model, list(lengths), policy, max_new_tokens=6).devices["cpu"]
    with kv_attention(tiny_llama.model), AllocatedBytes() as m:
        generate_batch(tiny_llama.model, ids, policy, max_new_tokens=6, attention="sdpa")
    assert 0.99 * m.peak <= acc.kv_cache + acc.transient <= 1.15 * m.peak, (acc.kv_cache + acc.transient, m.peak)


def test_the_compressed_cache_gives_its_memory_back(tiny_llama):
    """After the one compression the cache is resized to the budget + the generated tokens."""
    sizes = []

    def watch(event, cache):
        sizes.append((event, cache.capacity))

    from kvbench.engine import generate

    p = Knorm(kv_size=20, schedule=AP)
    generate(tiny_llama.model, tiny_llama.tokenizer, random_prompts((80, 60), seed=2), p, 2, max_new_tokens=5,
             eos_token_ids=[], observer=watch)
    assert sizes[0][1] == 80 and sizes[-1][1] == 25 and [e for e, _ in sizes].count("evict") == 1
