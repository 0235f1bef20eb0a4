"""kvbench.attention.interface: no setting lives in a module. Each forward hands attention its step (backend, query
chunk, layout, sink), so two runs with different backends share nothing; `kv_attention` restores the model's own
implementation after a run, after a run that raised, and after nested blocks, and removes the hidden-state hooks
it added."""

from __future__ import annotations

import pytest
import torch

from kvbench import engine
from kvbench.attention import interface
from kvbench.attention.static_step import StaticStep
from kvbench.policies import BatchMax
from tests.conftest import random_prompts


def hooks(model) -> int:
    return sum(len(m._forward_pre_hooks) for m in interface.attention_modules(model))


def test_a_run_leaves_the_model_as_it_was_and_the_step_carries_the_backend(tiny_llama, monkeypatch):
    model = tiny_llama.model
    before = model.config._attn_implementation, hooks(model)
    seen = []
    attend = StaticStep.attend
    monkeypatch.setattr(StaticStep, "attend", lambda self, *a: seen.append((self.backend, self.score_chunk))
                        or attend(self, *a))
    out = engine.generate(model, tiny_llama.tokenizer, random_prompts((9, 5), seed=3),
                          BatchMax(kv_size=8, evict_every=4), 2, max_new_tokens=3, attention="eager", score_chunk=5)
    assert out.attention == "eager" and set(seen) == {("eager", 5)}
    assert (model.config._attn_implementation, hooks(model)) == before
    assert not any(isinstance(v, StaticStep) for v in vars(interface).values())  # nothing kept in the module


def test_an_exception_inside_the_block_restores_the_model_and_removes_the_hooks(tiny_llama):
    model = tiny_llama.model
    before = model.config._attn_implementation, hooks(model)
    with pytest.raises(ValueError, match="inside"):
        with interface.kv_attention(model, hidden=True):
            assert model.config._attn_implementation == interface.NAME
            assert hooks(model) == before[1] + model.config.num_hidden_layers
            raise ValueError("inside the block")
    assert (model.config._attn_implementation, hooks(model)) == before


def test_nested_blocks_restore_the_outer_one(tiny_llama):
    model = tiny_llama.model
    previous = model.config._attn_implementation
    with interface.kv_attention(model):
        with interface.kv_attention(model):
            assert model.config._attn_implementation == interface.NAME
        assert model.config._attn_implementation == interface.NAME  # the inner block gave back the outer's
    assert model.config._attn_implementation == previous


def test_without_a_step_the_function_is_sdpa(tiny_llama):
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 4, 3, 8)
    module = tiny_llama.model.get_decoder().layers[0].self_attn
    out, _ = interface.kvbench_attention(module, q, k, k, None, scaling=8**-0.5, is_causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True, scale=8**-0.5).transpose(1, 2)
    torch.testing.assert_close(out, ref)


def test_the_hidden_states_hook_hands_them_to_the_step(tiny_llama):
    """With hidden=True each attention module's input (B, T, h) reaches the forward's step, layer by layer."""
    model = tiny_llama.model

    class Step:
        def __init__(self):
            self.got = {}

        def hidden(self, layer, states):
            self.got[layer] = states.shape

        def attend(self, module, query, key, value, scaling, kwargs):
            return torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True,
                                                                    enable_gqa=True).transpose(1, 2)

    step = Step()
    ids = torch.tensor([random_prompts((6,), seed=1)[0]])
    with interface.kv_attention(model, hidden=True), torch.inference_mode():
        model(input_ids=ids, use_cache=False, kvbench_step=step)
    assert step.got == {i: (1, 6, model.config.hidden_size) for i in range(model.config.num_hidden_layers)}
