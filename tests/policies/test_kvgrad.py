"""KVgrad (kvbench.policies.kvgrad) in the engine against kvpress 0.5.5's fixture and the brute-force reference
(tests/reference_passes.py's reconstruction table with `grad=True`: autograd on the reference decoder's own pass),
on the tiny model of tests/kvpress_tiny.py: the pairs each (layer, KV head) keeps and the greedy tokens, at batch 1
and per row of a left-padded batch (pads add nothing to the objective: rows stay independent); the pass leaves the
model as it found it (parameters requiring gradients, no gradient kept)."""

from __future__ import annotations

import pytest
import torch

from kvbench.errors import ConfigError
from kvbench.policies.kvgrad import KVgrad
from tests import kvpress_tiny as T
from tests import reference_generate as G
from tests.policies.test_kvzip import model, run
from tests.policies.test_reference_methods import fixture, prefilled


def test_kvgrad_keeps_kvpress_pairs_and_generates_its_tokens():
    fx = fixture("kvgrad")
    tokens, kept, stats = run(KVgrad(compression_ratio=fx["ratio"], chunk_size=fx["args"]["chunk_size"]),
                              [fx["ids"]])
    assert kept[0] == fx["kept"] and tokens[0] == fx["tokens"][:6]
    assert 0 < stats["score_pass_s"] < stats["prefill_s"]
    assert all(p.requires_grad and p.grad is None for p in model().parameters())


def test_each_row_of_a_padded_batch_is_the_reference():
    """Contexts of 40, 23 and 12 ids (3, 2 and 1 passes of 16, the shorter ones padded): each row keeps the
    reference rule's pairs and decodes its tokens."""
    prompts = [T.prompt_ids(40, seed=1), T.prompt_ids(23, seed=5), T.prompt_ids(12, seed=4)]
    tokens, kept, _ = run(KVgrad(compression_ratio=0.5, chunk_size=16), prompts)
    ref = prefilled()[0]
    for b, ids in enumerate(prompts):
        want_tokens, want = G.generate(ref, ids, 6, "kvgrad", 0.5, T.CharTokenizer(), chunk=16)
        assert kept[b] == want, b
        assert tokens[b] == want_tokens, b


@pytest.mark.parametrize("schedule", ["decode_only", "prefill_and_decode"])
def test_schedules_where_it_is_not_defined_are_refused(schedule):
    with pytest.raises(ConfigError, match="after prefill only"):
        KVgrad(schedule=schedule)


def test_defaults_are_kvpress_ones():
    p = KVgrad()
    assert (p.chunk_size, p.n_sink, p.head_budget) == (512, 4, "global")
    assert p.needs.pass_grad and torch.is_grad_enabled()
