"""Budgets that differ by sample (`policy.kv_ratio`) and by layer (PyramidKV), against the brute-force
reference of tests/reference.py.

kv_ratio: inside a left-padded batch of 4 prompts of different lengths, each sample must evict exactly
as the reference does at batch size 1 with kv_size = its own budget (ceil(ratio x its length)), and
hold no more than that budget at any point. PyramidKV: the reference evicts each layer by its own
budget; the engine must match it per sample, and no layer may ever hold more than its budget. The memory
account must equal the cache's allocation (each layer sized by its own budget).
"""

from __future__ import annotations

import math

import pytest
import torch

from kvbench import budgets as B
from kvbench import memory
from kvbench.engine import generate
from kvbench.errors import ConfigError
from kvbench.policies import H2O, BatchMax, PyramidKV, SnapKV, StreamingLLM
from tests.conftest import random_prompts
from tests.policies.test_scored import NEW, PROMPTS, assert_traces_match, reference, spec_of

RATIO_POLICIES = [
    BatchMax(kv_ratio=0.5, evict_every=4),  # prefill_and_decode
    H2O(kv_ratio=0.5, evict_every=2, protect_recent=4),  # decode_only
    SnapKV(kv_ratio=0.6, evict_every=4, window=4, schedule="prefill_and_decode"),
    StreamingLLM(kv_ratio=0.5, evict_every=4),  # the slicing path
]


def pid(p) -> str:
    return f"{p.name}-{p.schedule}-ratio{p.kv_ratio}-kv{p.kv_size}-p{p.evict_every}"


class Watch:
    """Engine observer: per sample, kept positions after each of its evictions, the final ones, and for every
    forward the pairs each (layer, sample) holds (checked against its budget)."""

    def __init__(self, batch: int):
        self.evictions = [[] for _ in range(batch)]
        self.final = [None] * batch
        self.prev = None
        self.held = []  # (event, (L, B) counts)

    @staticmethod
    def kept(cache, b):
        return [cache.kept_positions(layer, b).tolist() for layer in range(cache.num_layers)]

    def __call__(self, event, cache):
        counts = torch.stack([cache.group_of(layer).n for layer in range(cache.num_layers)])  # (L, B)
        self.held.append((event, counts.clone(), cache.budgets.clone()))
        if event == "evict":
            for b in torch.nonzero((counts < self.prev).any(dim=0))[:, 0].tolist():
                self.evictions[b].append((int(cache.seen[b]), self.kept(cache, b)))
        else:
            for b in range(len(self.final)):
                self.final[b] = self.kept(cache, b)
        self.prev = counts


def run(lm, prompts, policy, batch_size, new=NEW):
    tokens, evictions, final, held = [], [], [], []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i : i + batch_size]
        w = Watch(len(chunk))
        out = generate(lm.model, lm.tokenizer, chunk, policy, len(chunk), max_new_tokens=new, eos_token_ids=[],
                       observer=w)
        tokens += out.token_ids
        evictions += w.evictions
        final += w.final
        held.append(w.held)
    return tokens, evictions, final, held, out


def assert_within_budgets(held, policy):
    """Every forward: each (layer, sample) holds at most its budget (decode_only: once its prompt is compressed)."""
    for batch in held:
        compressed = torch.zeros_like(batch[0][1], dtype=torch.bool)
        for event, counts, budgets in batch:
            if event == "evict":
                compressed |= counts < budgets
            if policy.schedule == "prefill_and_decode" or event == "evict":
                over = counts > budgets
            else:
                over = (counts > budgets) & compressed
            assert not bool(over.any()), (event, counts, budgets)


# ------------------------------------------------------------------------------------------- kv_ratio


def test_sample_budgets_are_a_share_of_each_prompt():
    p = BatchMax(kv_ratio=0.5, evict_every=4)
    assert p.kv_size is None and p.evicts
    assert B.sample_budgets(p, [70, 24, 45, 13]).tolist() == [35, 12, 23, max(B.min_budget(p), 7)]
    assert B.layer_budgets(p, [70, 24], 3).tolist() == [[35, 12]] * 3
    with pytest.raises(ConfigError, match="kv_ratio"):
        BatchMax(kv_ratio=1.5)


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("policy", RATIO_POLICIES, ids=pid)
def test_kv_ratio_matches_reference_per_sample(tiny_llama, policy, batch_size):
    """Sample b of a padded batch == the reference at kv_size = ceil(ratio x len_b) (at least min_budget)."""
    budgets = B.sample_budgets(policy, [len(p) for p in PROMPTS]).tolist()
    assert len(set(budgets)) == len(budgets)  # every sample its own budget
    refs = []
    for p, k in zip(PROMPTS, budgets, strict=True):
        spec = spec_of(policy)
        spec = type(spec)(**{**spec.__dict__, "kv_size": k})
        refs.append(reference("llama", tuple(p), spec))
    tokens, evictions, final, held, out = run(tiny_llama, PROMPTS, policy, batch_size)
    assert_traces_match(refs, tokens, evictions, final)
    assert_within_budgets(held, policy)
    assert all(ref.evictions for ref in refs)
    if batch_size == 4:
        assert (out.budget_min, out.budget_max) == (min(budgets), max(budgets))


@pytest.mark.parametrize("schedule", ["prefill_and_decode", "decode_only"])
def test_kv_ratio_batch_4_every_sample_within_its_own_budget(tiny_phi3, schedule):
    prompts = random_prompts((50, 9, 33, 61), seed=11)
    policy = SnapKV(kv_ratio=0.5, evict_every=4, window=4, schedule=schedule)
    tokens, _, _, held, out = run(tiny_phi3, prompts, policy, 4)
    assert all(len(t) == NEW for t in tokens)
    assert_within_budgets(held, policy)
    assert out.budget_min == B.min_budget(policy) and out.budget_max == math.ceil(0.5 * 61)
    # the samples really hold different counts at the end: 25 + decode, 9's floor, 17, 31
    last = held[0][-1][1][0].tolist()
    assert len(set(last)) > 1


# ------------------------------------------------------------------------------------------- PyramidKV


def test_pyramid_budgets_shrink_bottom_to_top_and_sum_to_kv_times_layers():
    """budget_rule=window_plus (kvbench's earlier rule): exact totals, the window on top of a pyramid."""
    p = PyramidKV(kv_size=256, evict_every=8, window=32, budget_rule="window_plus")
    k = B.layer_budgets(p, [1000, 500], 30)  # (L, B)
    assert k.shape == (30, 2)
    assert k.sum(dim=0).tolist() == [256 * 30] * 2
    col = k[:, 0].tolist()
    assert col == sorted(col, reverse=True) and col[0] > 256 > col[-1]
    assert col[-1] >= B.min_budget(p)
    # published numbers where nothing is raised: min = (k - W) / beta
    assert col[-1] == 32 + round((256 - 32) / 20) or abs(col[-1] - (32 + (256 - 32) / 20)) < 1
    # raised floor: kv 128, p 32 -> the top layer holds min_budget
    q = PyramidKV(kv_size=128, evict_every=32, window=32, budget_rule="window_plus")
    kq = B.layer_budgets(q, [1000], 30)[:, 0]
    assert int(kq.min()) == B.min_budget(q) == 65 and int(kq.sum()) == 128 * 30
    assert any("raised" in e for e in q.describe()["extensions"])
    # ratio budgets, per sample
    r = PyramidKV(kv_ratio=0.5, evict_every=4, window=4, budget_rule="window_plus")
    kr = B.layer_budgets(r, [200, 100], 4)
    assert kr.sum(dim=0).tolist() == [100 * 4, 50 * 4]
    with pytest.raises(ConfigError, match="rerotate"):
        PyramidKV(kv_size=256, rerotate=True)


PYRAMIDS = [  # the per-layer mechanics, under budgets that differ by layer at these small sizes
    PyramidKV(kv_size=32, evict_every=4, window=4, budget_rule="window_plus"),  # decode_only
    PyramidKV(kv_size=32, evict_every=4, window=4, schedule="prefill_and_decode", budget_rule="window_plus"),
    PyramidKV(kv_size=24, evict_every=2, window=3, pooling="avg", kernel=5, beta=2, schedule="prefill_and_decode"),
    PyramidKV(kv_ratio=0.6, evict_every=4, window=4, schedule="prefill_and_decode", budget_rule="window_plus"),
    PyramidKV(kv_size=32, evict_every=4, window=4, beta=2),  # the published rule, decode_only
]


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("policy", PYRAMIDS, ids=pid)
@pytest.mark.parametrize("arch", ["llama", "phi3"])
def test_pyramidkv_matches_per_layer_reference(arch, policy, batch_size, request):
    lm = request.getfixturevalue(f"tiny_{arch}")
    L = lm.model.config.num_hidden_layers
    budgets = B.layer_budgets(policy, [len(p) for p in PROMPTS], L)  # (L, B)
    assert bool((budgets[0] >= budgets[-1]).all() and (budgets[0] > budgets[-1]).sum() >= 2)  # layers differ
    refs = []
    for b, p in enumerate(PROMPTS):
        spec = spec_of(policy)
        spec = type(spec)(**{**spec.__dict__, "rule": "snapkv", "kv_size": int(budgets[:, b].min()),
                              "layer_kv": tuple(budgets[:, b].tolist())})
        refs.append(reference(arch, tuple(p), spec))
    tokens, evictions, final, held, _ = run(lm, PROMPTS, policy, batch_size)
    assert_traces_match(refs, tokens, evictions, final)
    assert_within_budgets(held, policy)
    assert all(ref.evictions for ref in refs)


def test_published_pyramid_budgets_are_kvpress_schedule():
    """PyramidKV's code as kvpress 0.5.5 computes it (hand-worked numbers): m = q (1 - ratio), min = m / beta,
    max = 2 m - min, max capped at q - W (then min = 2 m - max), SnapKV's budget when not q >= max >= min >= W,
    else round(max - l (max - min) / (L - 1))."""
    p = PyramidKV(compression_ratio=0.5, schedule="after_prefill", window=64)
    k = B.layer_budgets(p, [1000, 200, 100], 30)
    # q 1000: m 500, max 975 >= 936 -> max 936, min 64; steps 872 / 29
    assert k[:, 0].tolist() == [round(936 - i * 872 / 29) for i in range(30)] and k[0, 0] == 936 and k[-1, 0] == 64
    # q 200: m 100, max 195 >= 136 -> max 136, min 64
    assert (k[0, 1], k[-1, 1]) == (136, 64)
    # q 100: m 50, max 97.5 >= 36 -> max 36, min 64 < max fails: SnapKV's round(50) in every layer
    assert k[:, 2].tolist() == [50] * 30
    # kv_size 256, W 64: min 12.8 < 64: SnapKV's budget everywhere (PyramidKV = SnapKV here)
    assert B.layer_budgets(PyramidKV(kv_size=256, evict_every=64), [1000], 30)[:, 0].tolist() == [256] * 30
    # prefill_and_decode / decode_only: no layer below min_budget (p + W + 1)
    q = PyramidKV(kv_size=200, evict_every=64, beta=3, window=64)  # min 66.7: >= W, below min_budget
    kq = B.layer_budgets(q, [1000], 30)[:, 0]
    assert int(kq.min()) == B.min_budget(q) == 129 and int(kq.max()) == round(400 - 200 / 3)
    assert any("min_budget=129" in e for e in q.describe()["extensions"])
    assert any("window_plus" in e for e in PyramidKV(kv_size=256, budget_rule="window_plus").describe()["extensions"])


def test_pyramidkv_differs_from_snapkv(tiny_llama):
    """The per-layer budgets change what is kept (same score, same total budget)."""
    pyr = PyramidKV(kv_size=32, evict_every=4, window=4, schedule="prefill_and_decode", beta=2)
    snap = SnapKV(kv_size=32, evict_every=4, window=4, schedule="prefill_and_decode")
    _, _, f_pyr, _, _ = run(tiny_llama, PROMPTS[:1], pyr, 1)
    _, _, f_snap, _, _ = run(tiny_llama, PROMPTS[:1], snap, 1)
    assert [len(h) for h in f_pyr[0][0]] != [len(h) for h in f_snap[0][0]]
    assert len(f_pyr[0][0][0]) > len(f_pyr[0][-1][0])  # the bottom layer holds more than the top one


@pytest.mark.parametrize("policy", [PYRAMIDS[0], PYRAMIDS[1], PYRAMIDS[3], RATIO_POLICIES[0], RATIO_POLICIES[1]],
                         ids=pid)
def test_account_equals_the_allocation_with_per_layer_and_per_sample_budgets(tiny_llama, policy):
    """The account's KV cache is the bytes the engine's cache allocates: per layer its own capacity."""
    lengths = [len(p) for p in PROMPTS]
    acc = memory.account(tiny_llama.model, lengths, policy, max_new_tokens=NEW)
    seen = []

    def obs(event, cache):
        if not seen:
            seen.append(cache.allocated_bytes())

    generate(tiny_llama.model, tiny_llama.tokenizer, PROMPTS, policy, 4, max_new_tokens=NEW, eos_token_ids=[],
             observer=obs)
    assert acc.devices["cpu"].kv_cache == seen[0]
    if policy.name == "pyramidkv" and policy.schedule == "prefill_and_decode":
        L = tiny_llama.model.config.num_hidden_layers
        uniform = memory.account(tiny_llama.model, lengths, SnapKV(kv_size=int(B.layer_budgets(policy, lengths, L).max()),
                                                                    evict_every=4, window=4,
                                                                    schedule=policy.schedule),
                                 max_new_tokens=NEW)
        assert acc.devices["cpu"].kv_cache < uniform.devices["cpu"].kv_cache  # not the largest layer's everywhere
