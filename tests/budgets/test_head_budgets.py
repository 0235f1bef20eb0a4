"""Head-adaptive budgets (`policy.head_budget=adaptive`, AdaKV): the engine against the brute-force reference
(tests/reference.py: per-(layer, KV head) Python lists, AdaKV's counts written from kvpress's AdaKVPress with
topk-free sorting of its own), per sample of a left-padded batch, under each attention backend; the cache's
memory is the largest head's, and the account charges it."""

from __future__ import annotations

import pytest
import torch

from kvbench import budgets as B
from kvbench import memory
from kvbench.engine import generate
from kvbench.policies import H2O, Knorm, SnapKV
from tests.policies.test_scored import NEW, PROMPTS, reference, spec_of

AP = "after_prefill"
POLICIES = [
    SnapKV(compression_ratio=0.5, schedule=AP, window=4, kernel=5, pooling="avg", head_budget="adaptive"),
    Knorm(compression_ratio=0.6, schedule=AP, head_budget="adaptive", head_floor=0.0),
    H2O(kv_size=12, schedule=AP, protect_recent=2, head_budget="adaptive", head_floor=0.5),
]


class Kept:
    """Observer: per sample, each (layer, KV head)'s kept positions after its eviction and at the end (holes out)."""

    def __init__(self, batch: int):
        self.evicted, self.final, self.room = [None] * batch, [None] * batch, [None] * batch

    @staticmethod
    def kept(cache, b):
        return [[[p for p in h if p >= 0] for h in cache.kept_positions(layer, b).tolist()]
                for layer in range(cache.num_layers)]

    def __call__(self, event, cache):
        for b in range(len(self.final)):
            if event == "evict" and self.evicted[b] is None and int(cache.groups[0].load[b]) < int(cache.seen[b]):
                self.evicted[b] = self.kept(cache, b)
                self.room[b] = cache.room.pairs[:, b].tolist()  # the Budgets room's (L, H) counts, set by attention
            self.final[b] = self.kept(cache, b)


CASES = [(POLICIES[0], 1, "sdpa"), (POLICIES[0], 4, "sdpa"), (POLICIES[0], 4, "eager"), (POLICIES[1], 4, "sdpa"),
         (POLICIES[2], 4, "fused"), (POLICIES[2], 1, "eager")]


@pytest.mark.parametrize(("policy", "batch_size", "attention"), CASES,
                         ids=[f"{p.name}-b{b}-{a}" for p, b, a in CASES])
def test_adaptive_matches_reference_per_sample(tiny_llama, policy, batch_size, attention):
    lm = tiny_llama
    budgets = B.sample_budgets(policy, [len(p) for p in PROMPTS]).tolist()
    spec = spec_of(policy)
    refs = [reference("llama", tuple(p), type(spec)(**{**spec.__dict__, "kv_size": k, "head_floor": policy.head_floor}))
            for p, k in zip(PROMPTS, budgets, strict=True)]
    tokens, uneven = [], False
    for i in range(0, len(PROMPTS), batch_size):
        chunk = PROMPTS[i : i + batch_size]
        w = Kept(len(chunk))
        out = generate(lm.model, lm.tokenizer, chunk, policy, len(chunk), max_new_tokens=NEW, eos_token_ids=[],
                       observer=w, attention=attention)
        for b, ref in enumerate(refs[i : i + batch_size]):
            assert w.evicted[b] == ref.evictions[0][1], f"sample {i + b}: kept after the compression"
            assert w.final[b] == ref.final, f"sample {i + b}: final kept positions"
            assert w.room[b] == [[len(h) for h in layer] for layer in ref.evictions[0][1]]
            per_head = [len(h) for layer in ref.evictions[0][1] for h in layer]
            uneven |= len(set(per_head)) > 1
            k = budgets[i + b]
            assert all(sum(len(h) for h in layer) == k * len(layer) for layer in ref.evictions[0][1])
        tokens += out.token_ids
        assert out.kv_allocated_bytes <= out.accounted.devices["cpu"].kv_cache  # the largest head accounted
    assert tokens == [r.tokens for r in refs]
    assert uneven  # the heads' counts differ: a uniform split would fail the kept sets above


def test_adaptive_changes_what_is_kept_and_memory_follows_the_largest_head(tiny_llama):
    lm, p = tiny_llama, PROMPTS[0]
    kw = dict(compression_ratio=0.5, schedule=AP, window=4)
    uni, ada = SnapKV(**kw), SnapKV(**kw, head_budget="adaptive", head_floor=0.0)
    got = {}
    for pol in (uni, ada):
        w = Kept(1)
        out = generate(lm.model, lm.tokenizer, [p], pol, 1, max_new_tokens=NEW, eos_token_ids=[], observer=w)
        got[pol.head_budget] = (w.evicted[0], out)
    assert got["uniform"][0] != got["adaptive"][0]
    heads = lm.model.config.num_key_value_heads
    k = int(len(p) * 0.5)
    acc = memory.account(lm.model, [len(p)], ada, max_new_tokens=NEW)
    acc_u = memory.account(lm.model, [len(p)], uni, max_new_tokens=NEW)
    assert acc.devices["cpu"].kv_cache >= acc_u.devices["cpu"].kv_cache  # a head may hold up to heads x k
    slots = min(heads * k, len(p)) + NEW
    assert B.capacities(ada, [len(p)], NEW, torch.tensor([[k]]), heads) == [max(slots, len(p))]
    ext = ada.describe(gqa=True)["extensions"]
    assert any("head_budget=adaptive" in e and "AdaKVPress" in e for e in ext)
