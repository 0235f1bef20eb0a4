"""kvbench.attention.patch: `kv_attention` leaves nothing behind. After a run, and after a run that raised, the
module's setting (`active()`: backend, query chunk) and the model's attention implementation are what they
were before; nested blocks restore the outer block's setting."""

from __future__ import annotations

import pytest

from kvbench import engine
from kvbench.attention import patch
from kvbench.policies import BatchMax
from tests.conftest import random_prompts


def snapshot(model):
    return patch.active(), model.config._attn_implementation


def test_a_run_leaves_the_setting_and_the_model_as_they_were(tiny_llama):
    before = snapshot(tiny_llama.model)
    assert before[0].backend == "sdpa"  # the default: nothing is active
    out = engine.generate(tiny_llama.model, tiny_llama.tokenizer, random_prompts((9, 5), seed=3),
                          BatchMax(kv_size=8, evict_every=4), 2, max_new_tokens=3, attention="eager", score_chunk=5)
    assert out.attention == "eager"  # the run did use another setting than the default
    assert snapshot(tiny_llama.model) == before


def test_an_exception_inside_the_block_restores_both(tiny_llama):
    model = tiny_llama.model
    before = snapshot(model)
    with pytest.raises(ValueError, match="inside"):
        with patch.kv_attention(model, score_chunk=7, backend="eager"):
            assert patch.active() == patch.Active(backend="eager", score_chunk=7)
            assert model.config._attn_implementation == patch.NAME
            raise ValueError("inside the block")
    assert snapshot(model) == before


def test_nested_blocks_restore_the_outer_setting(tiny_llama):
    model = tiny_llama.model
    with patch.kv_attention(model, score_chunk=3, backend="fused", needs_attention=True):
        outer = patch.active()
        with patch.kv_attention(model, score_chunk=9, backend="eager"):
            assert patch.active().score_chunk == 9
        assert patch.active() == outer == patch.Active(backend="fused", score_chunk=3)
        assert model.config._attn_implementation == patch.NAME  # the inner block gave back the outer's patch
    assert patch.active() == patch.Active()


def test_a_backend_that_cannot_be_resolved_changes_nothing(tiny_llama, monkeypatch):
    model = tiny_llama.model
    before = snapshot(model)

    def refuse(*a, **k):
        raise RuntimeError("no backend")

    monkeypatch.setattr(patch, "resolve_backend", refuse)
    with pytest.raises(RuntimeError, match="no backend"):
        with patch.kv_attention(model, backend="auto"):
            pass
    assert snapshot(model) == before
