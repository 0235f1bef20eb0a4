"""The Budgets room (kvbench.budgets): its arithmetic against hand-computed numbers, and AdaKV's allocation rule
against kvpress 0.5.5's `AdaKVPress.compress` transcribed (topk over the flattened heads, not kvbench's sorts)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from kvbench import budgets as B
from kvbench.budgets import Budgets
from kvbench.budgets.adaptive_heads import head_counts
from kvbench.errors import ConfigError
from kvbench.policies import H2O, TOVA, PyramidKV, SnapKV, StreamingLLM, Window


def kvpress_counts(scores: torch.Tensor, compression_ratio: float, alpha: float) -> torch.Tensor:
    """kvpress 0.5.5 AdaKVPress.compress on (B, H, N) scores, as published: the (B, H) pairs each head keeps."""
    scores = scores.clone()
    bsz, num_key_value_heads, k_len = scores.shape
    n_kept = int(k_len * (1 - compression_ratio))
    n_safe = int(n_kept * alpha)
    top_indices = torch.topk(scores, n_safe, dim=-1).indices
    scores.scatter_(-1, top_indices, torch.finfo(scores.dtype).max)
    n_pruned = num_key_value_heads * (k_len - n_kept)
    indices = torch.topk(-scores.reshape(bsz, -1), n_pruned, dim=1).indices
    pruned = torch.zeros(bsz, num_key_value_heads, dtype=torch.long)
    for b in range(bsz):
        pruned[b] += torch.bincount(indices[b] // k_len, minlength=num_key_value_heads)
    return k_len - pruned


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75, 0.9])
@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.5, 1.0])
def test_head_counts_are_kvpress_adakv(ratio, alpha):
    g = torch.Generator().manual_seed(int(ratio * 100 + alpha * 10))
    B, H, N = 3, 4, 57
    # heads with different concentration: head h's scores spread like exp(h x noise)
    scores = torch.exp(torch.randn(B, H, N, generator=g) * torch.arange(1, H + 1)[None, :, None])
    want = kvpress_counts(scores, ratio, alpha)
    keep = torch.full((B,), int(N * (1 - ratio)))
    got = head_counts(scores[None], keep, alpha)[0]  # one layer
    assert torch.equal(got, want), (got, want)
    assert bool((got.sum(-1) == H * keep).all())
    assert bool((got >= int(keep[0] * alpha)).all())
    if alpha < 1 and ratio >= 0.5:
        assert len(set(got.flatten().tolist())) > 1  # the heads' counts differ: the rule is not uniform


def test_head_counts_keep_protected_pairs_and_skip_empty_slots():
    L, B, H, N = 2, 2, 3, 10
    s = torch.rand(L, B, H, N, generator=torch.Generator().manual_seed(0))
    s[:, :, 0, :] *= 0.01  # head 0 scores low everywhere
    s[..., :2] = float("inf")  # protected in every head
    s[:, 1, :, 8:] = -float("inf")  # sample 1 holds 8 pairs
    keep = torch.tensor([4, 3])
    c = head_counts(s, keep, 0.0)
    assert c.sum(-1).tolist() == [[12, 9], [12, 9]]
    assert bool((c >= 2).all())  # the protected pairs are kept in every head, even the low one
    assert bool((c[:, 1] <= 8).all())
    assert bool((c[:, :, 0] == 2).all())  # the low head keeps only its protected pairs
    ragged = head_counts(s, torch.tensor([4, 4]), 1.0)  # a floor of the whole budget: uniform
    assert bool((ragged == 4).all())


def test_budgets_room_uniform_matches_the_policy_budgets():
    p = SnapKV(kv_ratio=0.5, evict_every=4, window=4)
    b = Budgets.of(p, [70, 24, 45], layers=3, heads=2)
    assert b.layer.tolist() == [[35, 12, 23]] * 3
    assert b.pairs.shape == (3, 3, 2) and bool((b.pairs == b.layer[..., None]).all())
    assert torch.equal(b.slots, b.layer)  # uniform: a head holds the layer's budget
    assert b.capacities([70, 24, 45], 10) == [70] * 3  # decode_only: the whole prompt first
    assert Budgets.of(SnapKV(kv_size=None), [5], 2, 2) is None  # the full cache
    pyr = Budgets.of(PyramidKV(kv_size=256, evict_every=64), [1000, 500], 4, 3)
    assert pyr.layer[:, 1].tolist() == [436, 316, 196, 129]
    assert pyr[[True, False, True, False]].layer[:, 1].tolist() == [436, 196]


def test_budgets_room_adaptive_bounds_the_largest_head():
    p = SnapKV(compression_ratio=0.5, schedule="after_prefill", head_budget="adaptive")  # floor 0.2
    b = Budgets.of(p, [1000, 400], layers=2, heads=3)
    assert b.layer[0].tolist() == [500, 200]
    assert b.slots[0].tolist() == [3 * 500 - 2 * 100, 3 * 200 - 2 * 40]  # every other head at its floor
    assert b.capacities([1000, 400], 64) == [1000 + 64] * 2  # capped by every token
    assert b.decode_capacity(200, 64) == 520 + 64
    b.set_heads([1], torch.tensor([False, True]), torch.tensor([[[300, 200, 100]]]))
    assert b.pairs[1, 1].tolist() == [300, 200, 100] and b.pairs[0, 1].tolist() == [200] * 3
    q = SnapKV(kv_size=64, window=8, schedule="after_prefill", head_budget="adaptive", head_floor=0.5)
    bq = Budgets.of(q, [100], layers=1, heads=2)
    assert bq.capacities([100], 10) == [2 * 64 - 32 + 10]  # the largest head, then every new token
    assert B.decode_capacity(q, 64, 10, heads=2) == 106
    with pytest.raises(ValueError, match="heads"):
        B.head_slots(q, 64, None)


def test_budget_rules_by_hand():
    h = H2O(kv_ratio=0.5)  # half of each budget protected
    assert B.min_budget(h) == 3 and B.recent_pairs(h, torch.tensor([10, 21])).tolist() == [5, 10]
    assert B.min_budget(H2O(kv_size=128)) == 1 + 64 + 1
    t = TOVA(kv_size=100, evict_every=10, schedule="prefill_and_decode")
    assert B.keep(t, 100) == 90 and B.capacities(t, [500], 20, torch.tensor([[100]])) == [100]
    a = TOVA(compression_ratio=0.75, schedule="after_prefill")
    assert B.min_budget(a) == 1 and B.sample_budgets(a, [100, 3]).tolist() == [25, 1]
    assert B.capacities(a, [100, 7], 10, torch.tensor([[25, 1]])) == [100]


def test_capacity_is_capped_at_what_each_sample_holds():
    """A sample never holds more than its prompt + new tokens: a budget above that never evicts and allocates no
    more (the full cache's capacity); per sample, the batch's capacity the most over its samples (by hand)."""
    whole = 100 + 4  # the full cache's capacity for prompts of 100 and 60 tokens, 4 new
    for p in (TOVA(kv_size=100_000, evict_every=8, schedule="prefill_and_decode"), H2O(kv_size=100_000),
              SnapKV(kv_size=100_000, schedule="after_prefill"),
              SnapKV(kv_size=100_000, schedule="after_prefill", head_budget="adaptive")):
        assert B.capacities(p, [100, 60], 4, B.layer_budgets(p, [100, 60], 2), heads=2) == [whole] * 2, p
    t = TOVA(kv_size=64, evict_every=8, schedule="prefill_and_decode")
    # sample 0 (10 tokens) holds at most 14 of its budget of 40; sample 1 needs its budget of 12: 14, not 40
    assert B.capacities(t, [10, 100], 4, torch.tensor([[40, 12]])) == [14]
    assert B.capacities(t, [10, 100], 4, torch.tensor([[40, 20]])) == [20]
    a = SnapKV(kv_size=64, schedule="after_prefill")  # 30 + 4 of sample 1's 64 + 4; sample 0 compressed: 20 + 4
    assert B.capacities(a, [90, 30], 4, torch.tensor([[20, 64]])) == [90]  # sample 0's prompt first
    assert B.capacities(a, [10, 30], 4, torch.tensor([[64, 64]])) == [34]


def test_pyramid_spans_the_compressed_layers():
    """PyramidKV over the layers the policy compresses (the others windowed): their budgets are the pyramid of
    that many layers, averaging the nominal budget; one compressed layer holds the nominal budget itself."""
    p = PyramidKV(kv_ratio=0.5, schedule="after_prefill", window=8)
    alone = B.layer_budgets(p, [400], 2)[:, 0]  # the pyramid of 2 layers: 2 x 200 - 200 / 20, 200 / 20
    assert alone.tolist() == [390, 10]
    six = B.layer_budgets(p, [400], 6, compressed=[2, 5])[:, 0]  # 2 of 6 layers compressed
    assert six[[2, 5]].tolist() == alone.tolist()
    assert B.layer_budgets(p, [400], 2, compressed=[1])[1, 0] == 200  # one layer: the nominal budget
    assert B.layer_budgets(p, [400], 1)[:, 0].tolist() == [200]


@pytest.mark.parametrize("bad", [dict(head_budget="per_head"), dict(head_floor=1.5), dict(head_floor=True)])
def test_head_budget_knobs_are_checked(bad):
    with pytest.raises(ConfigError, match="policy.head_"):
        SnapKV(kv_size=128, **bad)


@pytest.mark.parametrize("cls", [Window, StreamingLLM])
def test_adaptive_needs_a_score(cls):
    with pytest.raises(ConfigError, match="policy.head_budget"):
        cls(kv_size=128, head_budget="adaptive")
    with pytest.raises(ConfigError, match="policy.head_budget"):
        SnapKV(kv_size=128, schedule="after_prefill", head_budget="adaptive", rerotate=True)
    with pytest.raises(ConfigError, match="after_prefill"):  # AdaKV's protocol: one compression after prefill
        SnapKV(kv_size=128, schedule="decode_only", head_budget="adaptive")


def test_policy_is_its_knobs_and_a_score():
    tree = ast.parse((Path(__file__).resolve().parents[2] / "kvbench/policies/policy.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Policy"]
    assert cls.end_lineno - cls.lineno + 1 <= 150
