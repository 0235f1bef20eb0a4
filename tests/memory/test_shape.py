"""kvbench.memory.shape: a loaded model's shape, read independently here from its parameters and config."""

from __future__ import annotations

from kvbench.memory.shape import ModelShape


def test_shape_of_a_tiny_llama(tiny_llama):
    model = tiny_llama.model
    s = ModelShape.of(model)
    params = {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()
    assert s.weights == {"cpu": sum(t.numel() * t.element_size() for t in params)}
    assert s.layers == {"cpu": model.config.num_hidden_layers}
    assert (s.q_heads, s.kv_heads) == (model.config.num_attention_heads, model.config.num_key_value_heads)
    assert s.elem == 8 and s.mlp_buffers == 3 and not s.fused_qkv and not s.manual and s.onload == {}
