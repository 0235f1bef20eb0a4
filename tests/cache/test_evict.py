"""The keeps_newest fast path (window, extreme_decode): slicing gives the same tokens and the same kept
positions as the generic score-sort-gather eviction, never calls the policy's score; and every record
carries `evict_s` (and `attn_stats_s`), zero where nothing is evicted or scored."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from kvbench import engine
from kvbench import run as kvrun
from kvbench.cache import KVCache
from kvbench.config import CONF_DIR
from kvbench.policies import BatchMax, ExtremeDecode, Full, Policy, Window
from tests.conftest import random_prompts

CASES = {
    "window-pd": lambda: Window(kv_size=16, evict_every=4),
    "window-pd-sinks": lambda: Window(kv_size=16, evict_every=4, protect_first=3, protect_recent=2),
    "window-do": lambda: Window(kv_size=16, evict_every=4, schedule="decode_only"),
    "window-do-sinks-p1": lambda: Window(kv_size=12, evict_every=1, schedule="decode_only", protect_first=2),
    "ed": lambda: ExtremeDecode(),
    "ed-kv5": lambda: ExtremeDecode(kv_size=5),
}


class Trace:
    """Observer: the kept positions of every layer and sample after each eviction."""

    def __init__(self):
        self.kept: list = []

    def __call__(self, event: str, cache: KVCache) -> None:
        if event == "evict":
            self.kept.append([[cache.kept_positions(layer, b).tolist() for b in range(cache.batch_size_)]
                              for layer in range(cache.num_layers)])


def _run(tiny, prompts, policy, prefill_chunk=None):
    trace = Trace()
    out = engine.generate(tiny.model, tiny.tokenizer, prompts, policy, 4, max_new_tokens=14, ignore_eos=True,
                          prefill_chunk=prefill_chunk, observer=trace)
    return out, trace.kept


@pytest.mark.parametrize("case", list(CASES))
def test_fast_path_equals_the_generic_path(tiny, prompts4, case, monkeypatch):
    policy = CASES[case]()
    assert policy.keeps_newest
    scored = []
    score = type(policy).score
    monkeypatch.setattr(type(policy), "score", lambda self, stats: scored.append(1) or score(self, stats))
    fast, fast_kept = _run(tiny, prompts4, policy)
    assert scored == [] and fast.evict_s > 0 and len(fast_kept) > 3  # it evicted, never scoring

    monkeypatch.setattr(type(policy), "keeps_newest", False)  # the same policy through score-sort-gather
    slow, slow_kept = _run(tiny, prompts4, policy)
    assert scored  # the generic path did score
    assert fast.token_ids == slow.token_ids
    assert fast_kept == slow_kept


def test_fast_path_with_uneven_rows(tiny_llama, monkeypatch):
    """Rows that evict from different counts (decode_only compressing prompts of different lengths, a
    prefill chunk that makes rows evict in different forwards) take the per-count slices."""
    prompts = random_prompts((37, 12, 25, 40), seed=5)
    policy = Window(kv_size=10, evict_every=3, protect_first=1)
    fast, fast_kept = _run(tiny_llama, prompts, policy, prefill_chunk=7)
    monkeypatch.setattr(Window, "keeps_newest", False)
    slow, slow_kept = _run(tiny_llama, prompts, policy, prefill_chunk=7)
    assert fast.token_ids == slow.token_ids and fast_kept == slow_kept


def test_only_position_scored_policies_claim_it():
    """The capability is declared, not inferred from a type: scored policies keep the generic path."""
    from kvbench.policies import registry

    claims = {name for name, cls in registry().items() if cls.keeps_newest}
    assert claims == {"window", "streaming_llm", "extreme_decode"} and not Policy.keeps_newest  # streaming_llm: a window


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_records_carry_evict_s(tmp_path):
    common = ["model=tiny-llama", "task.n_samples=2", "task.context_tokens=40", "gen.max_new_tokens=4", "batch_size=2",
              f"results_dir={tmp_path}"]
    full = kvrun.run(_compose(*common, "policy=full"))
    bm = kvrun.run(_compose(*common, "policy=batch_max", "policy.kv_size=16", "policy.evict_every=4",
                             "gen.attention=sdpa"))  # a separate statistics pass, timed
    fused = kvrun.run(_compose(*common, "policy=batch_max", "policy.kv_size=16", "policy.evict_every=4",
                                "gen.attention=fused"))  # statistics inside the attention: not separable
    assert full["status"] == bm["status"] == fused["status"] == "ok"
    assert full["evict_s"] == 0.0 and full["attn_stats_s"] == 0.0
    assert 0 < bm["evict_s"] < bm["prefill_s"] + bm["decode_s"] and 0 < bm["attn_stats_s"]
    assert 0 < fused["evict_s"] and fused["attn_stats_s"] is None


def test_generation_output_sums_evict_s_over_batches(tiny_llama):
    prompts = random_prompts((30, 22, 31, 26))
    one = engine.generate(tiny_llama.model, tiny_llama.tokenizer, prompts, BatchMax(kv_size=16, evict_every=4), 2,
                          max_new_tokens=5, attention="sdpa")
    assert one.batches == 2 and 0 < one.evict_s and 0 < one.attn_stats_s < one.prefill_s + one.decode_s
    assert engine.generate(tiny_llama.model, tiny_llama.tokenizer, prompts, Full(), 2, max_new_tokens=5).evict_s == 0
