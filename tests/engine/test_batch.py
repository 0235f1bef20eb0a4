"""A batch's KV cache is freed by reference counting the moment `generate_batch` returns or raises.

Every test here runs with the cyclic collector disabled and `gc.collect` made a no-op, so a cache kept
alive by a reference cycle (what the layer views used to form) stays visible: weak references to the
caches must be dead and `memory.memory_level` (which no longer collects) must not have grown on CPU.
"""

from __future__ import annotations

import weakref

import pytest
import torch
from hydra import compose, initialize_config_dir

from kvbench import engine, memory, search
from kvbench import run as kvrun
from kvbench.cache import KVCache
from kvbench.config import CONF_DIR, build_policy
from kvbench.policies import BatchMax, ExtremeDecode, Full, Window
from tests.conftest import random_prompts


class CacheRefs:
    """An observer that keeps only weak references to every cache it sees."""

    def __init__(self):
        self.refs: list[weakref.ref] = []

    def __call__(self, event: str, cache: KVCache) -> None:
        if not any(r() is cache for r in self.refs):
            self.refs.append(weakref.ref(cache))

    def alive(self) -> int:
        return sum(r() is not None for r in self.refs)


@pytest.mark.parametrize(
    "policy", [Full(), Window(kv_size=16, evict_every=4), BatchMax(kv_size=16, evict_every=4), ExtremeDecode()],
    ids=lambda p: p.name,
)
def test_generate_leaves_no_live_cache(tiny_llama, no_gc, policy):
    refs, before = CacheRefs(), memory.memory_level([])  # caches other tests may hold are not ours
    out = engine.generate(tiny_llama.model, tiny_llama.tokenizer, random_prompts((30, 12, 25, 19, 33, 8)), policy, 2,
                          max_new_tokens=6, observer=refs)
    assert out.batches == 3 and len(refs.refs) == 3
    assert refs.alive() == 0
    assert memory.memory_level([]) == before


def test_eos_stop_leaves_no_live_cache(tiny_llama, no_gc):
    """The EOS path (a batch that stops early) frees its cache too."""
    prompts = random_prompts((20, 14, 9))
    first = engine.generate(tiny_llama.model, tiny_llama.tokenizer, prompts, Full(), 3, max_new_tokens=3,
                            eos_token_ids=[])
    eos = [first.token_ids[0][1], first.token_ids[1][1], first.token_ids[2][1]]
    refs = CacheRefs()
    out = engine.generate(tiny_llama.model, tiny_llama.tokenizer, prompts, Full(), 3, max_new_tokens=8,
                          eos_token_ids=eos, observer=refs)
    assert max(len(t) for t in out.token_ids) < 8  # it did stop early
    assert len(refs.refs) == 1 and refs.alive() == 0


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


TINY = ["model=tiny-llama", "gen.max_new_tokens=6", "policy=batch_max", "policy.kv_size=32", "policy.evict_every=8"]


def test_oom_trial_of_the_search_leaves_no_live_cache(monkeypatch, no_gc):
    """A search trial that runs out of memory mid-decode (after prefill and an eviction) frees its cache."""
    cfg = _compose(*TINY)
    lm, policy = kvrun.models.load_model(cfg), build_policy(cfg)
    ids = [list(range(40, 90)), list(range(10, 70))]
    refs, begin, calls = CacheRefs(), KVCache.begin_forward, []

    def begin_or_oom(self, r, width):
        refs("forward", self)
        calls.append(1)
        if self.batch_size_ >= 4 and len(calls) >= 9:  # the prefill's 7 forwards and a decode step ran
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return begin(self, r, width)

    monkeypatch.setattr(KVCache, "begin_forward", begin_or_oom)
    before = memory.memory_level([])
    trial = search.probe(cfg, lm, policy, ids, 4, None)
    assert trial.status == "oom" and len(calls) == 9
    assert trial.leaked_bytes == 0 and refs.alive() == 0 and memory.memory_level([]) == before
    ok = search.probe(cfg, lm, policy, ids, 2, None)  # and an ok trial after it
    assert ok.status == "ok" and refs.alive() == 0


def test_a_held_cache_has_given_its_tensors_back(tiny_llama, no_gc):
    """Even a cache something still references (e.g. a traceback's frame) holds no tensor after return."""
    held: list[KVCache] = []
    before = memory.memory_level([])
    engine.generate(tiny_llama.model, tiny_llama.tokenizer, random_prompts((20, 10)), Full(), 2, max_new_tokens=3,
                    observer=lambda e, c: held.append(c))
    assert held and held[0].allocated_bytes() == 0 and memory.memory_level([]) == before
