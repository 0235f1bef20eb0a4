"""KVzip (kvbench.policies.kvzip) in the engine against the brute-force reference (tests/reference_passes.py's
reconstruction table, tests/reference_select.py's `kvzip`, tests/reference_generate.py's after_prefill decoding)
and kvpress 0.5.5's fixtures, on the tiny model of tests/kvpress_tiny.py: the pairs each (layer, KV head) keeps
after the compression and the greedy tokens, at batch 1 and per row of a left-padded batch of prompts of
different lengths (passes of different lengths and counts); the schedules where it is not defined refused."""

from __future__ import annotations

import functools

import pytest
import torch

from kvbench.attention import kv_attention
from kvbench.engine import generate_batch
from kvbench.errors import ConfigError
from kvbench.policies.kvzip import KVzip
from kvbench.policies.kvzip_plus import KVzipPlus
from tests import kvpress_tiny as T
from tests import reference_generate as G
from tests.policies.test_reference_methods import fixture, prefilled

NEW = 6


@functools.cache
def model():
    return T.tiny_model(torch.float32)


def run(policy, prompts: list[list[int]], questions: list[int] | None = None):
    """(tokens per row, kept[row][layer][kv_head] = positions after the compression, stats); `questions`: each
    row's last tokens that are its question (query-agnostic)."""
    policy.prepare(T.CharTokenizer())
    kept = []

    def observer(event, cache):
        if event == "evict":
            kept.append([[[[p for p in row if p >= 0] for row in cache.kept_positions(layer, b).tolist()]
                           for layer in range(cache.num_layers)] for b in range(len(prompts))])

    with kv_attention(model()):
        tokens, stats = generate_batch(model(), prompts, policy, max_new_tokens=NEW, ignore_eos=True,
                                       observer=observer, question_tokens=questions)
    assert len(kept) == 1  # one compression
    return tokens, kept[0], stats


@pytest.mark.parametrize("name", ["kvzip", "kvzip_layerwise", "kvzip_plus"])
def test_kvzip_keeps_kvpress_pairs_and_generates_its_tokens(name):
    fx = fixture(name)
    rule = "layerwise" if fx["args"].get("layerwise") else "global"
    cls = KVzipPlus if fx["args"].get("kvzip_plus_normalization") else KVzip
    tokens, kept, stats = run(cls(compression_ratio=fx["ratio"], chunk_size=fx["args"]["chunk_size"],
                                    head_budget=rule), [fx["ids"]])
    assert kept[0] == fx["kept"] and tokens[0] == fx["tokens"][:NEW]
    assert 0 < stats["score_pass_s"] < stats["prefill_s"]


@pytest.mark.parametrize("plus", [False, True])
@pytest.mark.parametrize("rule", ["global", "layerwise"])
def test_each_row_of_a_padded_batch_is_the_reference(rule, plus):
    """Contexts of 40, 23, 57 and 12 ids (3, 2, 4 and 1 passes of 16, the last ones padded): each row keeps the reference rule's pairs and
    decodes its tokens; the per-head counts differ (the global rule)."""
    prompts = [T.prompt_ids(40, seed=1), T.prompt_ids(23, seed=5), T.prompt_ids(57, seed=9), T.prompt_ids(12, seed=4)]
    tokens, kept, _ = run((KVzipPlus if plus else KVzip)(compression_ratio=0.5, chunk_size=16, head_budget=rule),
                          prompts)
    ref = prefilled()[0]
    for b, ids in enumerate(prompts):
        want_tokens, want = G.generate(ref, ids, NEW, "kvzip", 0.5, T.CharTokenizer(), chunk=16,
                                       layerwise=rule == "layerwise", plus=plus)
        assert kept[b] == want, b
        assert tokens[b] == want_tokens, b
    assert len({len(h) for layer in kept[2] for h in layer}) > 1


@pytest.mark.parametrize("schedule", ["decode_only", "prefill_and_decode"])
def test_schedules_where_it_is_not_defined_are_refused(schedule):
    with pytest.raises(ConfigError, match="after prefill only"):
        KVzip(schedule=schedule)
    with pytest.raises(ConfigError, match="global or layerwise"):
        KVzip(head_budget="uniform")


def test_query_agnostic_compresses_the_context_before_the_question():
    """task.query_aware=false: the passes reconstruct each row's context only (its question not yet seen), and
    each row keeps the reference rule's pairs of its context."""
    from tests import reference_passes as P
    from tests import reference_select as S

    prompts = [T.prompt_ids(46, seed=2), T.prompt_ids(30, seed=6)]
    questions = [6, 4]
    _, kept, _ = run(KVzip(compression_ratio=0.5, chunk_size=16), prompts, questions)
    ref = prefilled()[0]
    for b, (ids, q) in enumerate(zip(prompts, questions, strict=True)):
        ctx = G.prefill(ref, ids[:-q], T.CharTokenizer())
        want = S.kvzip(P.kvzip_table(ref, ctx.cache, T.CharTokenizer(), ctx.ids, chunk=16), 0.5)
        assert kept[b] == want, b
