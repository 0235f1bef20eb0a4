"""Cache invariants measured from the cache itself, and position-based policies against references
built on transformers' own DynamicCache (Algorithm 1 with oldest-first eviction, Algorithm 2)."""

import pytest
import torch
from transformers import DynamicCache

from kvbench.engine import generate
from kvbench.models.compat import cache_kwarg
from kvbench.policies import H2O, TOVA, BatchMax, ExtremeDecode, Full, Window
from tests.conftest import random_prompts

PROMPTS = random_prompts((70, 33, 51, 90), seed=3)


class Recorder:
    """Observer: after every forward and eviction, the count and kept positions of every sample."""

    def __init__(self):
        self.events = []

    def __call__(self, event, cache):
        kept = [[cache.kept_positions(layer, b).clone() for b in range(cache.batch_size_)] for layer in range(cache.num_layers)]
        self.events.append((event, cache.n.clone(), cache.seen.clone(), kept))


ALL = [
    BatchMax(kv_size=32, evict_every=8),
    BatchMax(kv_size=32, evict_every=8, schedule="decode_only"),
    H2O(kv_size=32),
    H2O(kv_size=32, evict_every=4, schedule="prefill_and_decode"),
    TOVA(kv_size=32),
    Window(kv_size=32, evict_every=8, protect_first=4),
    Window(kv_size=24, evict_every=1, schedule="decode_only"),
    ExtremeDecode(kv_size=2),
]


@pytest.mark.parametrize("policy", ALL, ids=lambda p: f"{p.name}-{p.schedule}-{p.evict_every}")
def test_cache_never_exceeds_budget(tiny_llama, policy):
    rec = Recorder()
    generate(tiny_llama.model, tiny_llama.tokenizer, PROMPTS, policy, 4, max_new_tokens=20, eos_token_ids=[], observer=rec)
    prefill_done = False
    for event, n, seen, kept in rec.events:
        for layer in kept:
            for b, pos in enumerate(layer):
                assert pos.shape[1] == n[b]  # every head holds n_b pairs
                assert bool((pos.diff(dim=1) > 0).all())  # position order, no duplicates
                assert bool((pos < seen[b]).all()) and bool((pos >= 0).all())
        if policy.evicts_in_prefill:
            assert int(n.max()) <= policy.kv_size, event
        prefill_done = prefill_done or bool((seen >= torch.tensor([len(p) for p in PROMPTS])).all())
        if not policy.evicts_in_prefill and not prefill_done:
            assert torch.equal(n, seen)  # decode_only holds the whole prompt during prefill
        if prefill_done and event == "forward" and int(seen.min()) > max(map(len, PROMPTS)):
            assert int(n.max()) <= policy.kv_size  # ...and at most kv_size once decoding


def test_decode_only_compresses_once_then_holds_kv_size(tiny_llama):
    rec = Recorder()
    pol = H2O(kv_size=32)
    generate(tiny_llama.model, tiny_llama.tokenizer, PROMPTS, pol, 4, max_new_tokens=10, eos_token_ids=[], observer=rec)
    forwards = [(n, seen) for e, n, seen, _ in rec.events if e == "forward"]
    n_prefill, seen_prefill = forwards[0]
    assert torch.equal(n_prefill, torch.tensor([len(p) for p in PROMPTS]))
    for n, _ in forwards[1:]:
        assert n.tolist() == [32] * 4  # after each decode step: exactly kv_size


@pytest.mark.parametrize("policy", ALL[:6], ids=lambda p: f"{p.name}-{p.schedule}")
def test_protected_pairs_never_evicted(tiny_llama, policy):
    pol = type(policy)(**{**policy.__dict__, "protect_first": 3, "protect_recent": 5})
    rec = Recorder()
    generate(tiny_llama.model, tiny_llama.tokenizer, PROMPTS, pol, 4, max_new_tokens=20, eos_token_ids=[], observer=rec)
    for event, _n, seen, kept in rec.events:
        for layer in kept:
            for b, pos in enumerate(layer):
                for h in range(pos.shape[0]):
                    assert set(range(min(3, int(seen[b])))) <= set(pos[h].tolist())
                    recent = set(range(max(0, int(seen[b]) - 5), int(seen[b])))
                    if event == "evict":
                        assert recent <= set(pos[h].tolist())


def _crop(cache, keep_idx):
    for layer in cache.layers:
        layer.keys = layer.keys[:, :, keep_idx]
        layer.values = layer.values[:, :, keep_idx]


def window_reference(model, prompt, max_new, kv, p, sinks=0, prefill_evict=True):
    """Algorithm 1 at batch size 1 with oldest-first eviction, on transformers' DynamicCache."""
    cache = DynamicCache(config=model.config)
    pos = []  # positions held

    def run(tokens, start):
        ids = torch.tensor([tokens])
        position_ids = torch.arange(start, start + len(tokens))[None]
        out = model(ids, position_ids=position_ids, **{cache_kwarg(model): cache}, use_cache=True)
        pos.extend(range(start, start + len(tokens)))
        return out.logits[0, -1].argmax().item()

    s = len(prompt)
    t1 = min(s, kv) if prefill_evict else s
    tok = run(prompt[:t1], 0)
    held = list(range(t1))
    while t1 < s:
        keep = list(range(sinks)) + list(range(sinks + p, len(held)))
        _crop(cache, torch.tensor(keep))
        held = [held[i] for i in keep]
        t0, t1 = t1, min(s, t1 + p)
        tok = run(prompt[t0:t1], t0)
        held += list(range(t0, t1))
    out = [tok]
    for t in range(1, max_new):
        if len(held) + 1 > kv:
            drop = len(held) - (kv - p)
            keep = list(range(sinks)) + list(range(sinks + drop, len(held)))
            _crop(cache, torch.tensor(keep))
            held = [held[i] for i in keep]
        tok = run([tok], s + t - 1)
        held.append(s + t - 1)
        out.append(tok)
    return out


@pytest.mark.parametrize("kv,p,sinks", [(32, 8, 0), (32, 8, 4), (20, 1, 2)])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_window_matches_reference(tiny, kv, p, sinks, batch_size):
    ref = [window_reference(tiny.model, pr, 16, kv, p, sinks) for pr in PROMPTS]
    out = generate(
        tiny.model, tiny.tokenizer, PROMPTS, Window(kv_size=kv, evict_every=p, protect_first=sinks),
        batch_size, max_new_tokens=16, eos_token_ids=[],
    )
    assert out.token_ids == ref


def test_window_keeps_exactly_the_last_positions(tiny_llama):
    rec = Recorder()
    pol = Window(kv_size=20, evict_every=4, protect_first=2)
    generate(tiny_llama.model, tiny_llama.tokenizer, PROMPTS, pol, 4, max_new_tokens=12, eos_token_ids=[], observer=rec)
    for _, n, seen, kept in rec.events:
        for layer in kept:
            for b, pos in enumerate(layer):
                nb, sb = int(n[b]), int(seen[b])
                sinks = list(range(min(2, nb))) if sb > nb else []
                expect = sinks + list(range(sb - (nb - len(sinks)), sb))
                assert pos.tolist() == [expect] * pos.shape[0]


def extreme_decode_reference(model, prompt, max_new, kv):
    """Algorithm 2 literally: full prefill, keep the newest pair; decode, and when the cache holds
    kv pairs keep only the newest."""
    cache = DynamicCache(config=model.config)
    s = len(prompt)
    out = model(torch.tensor([prompt]), **{cache_kwarg(model): cache}, use_cache=True)
    _crop(cache, torch.tensor([s - 1]))
    tok = out.logits[0, -1].argmax().item()
    toks = [tok]
    for t in range(1, max_new):
        out = model(torch.tensor([[tok]]), position_ids=torch.tensor([[s + t - 1]]), **{cache_kwarg(model): cache}, use_cache=True)
        if cache.layers[0].keys.shape[2] == kv:
            _crop(cache, torch.tensor([kv - 1]))
        tok = out.logits[0, -1].argmax().item()
        toks.append(tok)
    return toks


@pytest.mark.parametrize("kv", [2, 5])
def test_extreme_decode_matches_algorithm_2(tiny, kv):
    ref = [extreme_decode_reference(tiny.model, p, 16, kv) for p in PROMPTS]
    out = generate(tiny.model, tiny.tokenizer, PROMPTS, ExtremeDecode(kv_size=kv), 4, max_new_tokens=16, eos_token_ids=[])
    assert out.token_ids == ref
    full = generate(tiny.model, tiny.tokenizer, PROMPTS, Full(), 4, max_new_tokens=16, eos_token_ids=[])
    assert out.token_ids != full.token_ids  # the reference is not trivially the full cache


@pytest.mark.parametrize("policy", ALL, ids=lambda p: f"{p.name}-{p.schedule}")
def test_large_budget_equals_full(tiny_phi3, policy):
    if policy.name == "extreme_decode":
        pytest.skip("extreme_decode always keeps one pair")
    big = type(policy)(**{**policy.__dict__, "kv_size": 200, "protect_recent": 0})
    full = generate(tiny_phi3.model, tiny_phi3.tokenizer, PROMPTS, Full(), 4, max_new_tokens=20, eos_token_ids=[])
    out = generate(tiny_phi3.model, tiny_phi3.tokenizer, PROMPTS, big, 4, max_new_tokens=20, eos_token_ids=[])
    assert out.token_ids == full.token_ids


def test_peak_kv_bytes_is_the_formula(tiny_llama):
    cfg = tiny_llama.model.config
    out = generate(tiny_llama.model, tiny_llama.tokenizer, PROMPTS, BatchMax(kv_size=32, evict_every=8), 4,
                   max_new_tokens=8, eos_token_ids=[])
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    assert out.peak_kv_bytes == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 32 * 8 * 4
