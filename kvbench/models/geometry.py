"""What kvbench reads off a loaded decoder-only model (Llama / Phi-3 style): its cache geometry and RoPE.

Used by the static engine (kvbench.engine) and the serving engine (kvbench.serve) alike.
"""

from __future__ import annotations

import torch


def model_geometry(model) -> dict:
    """Cache geometry of a decoder-only transformers model (Llama / Phi-3 style)."""
    cfg = model.config
    heads = cfg.num_attention_heads
    layers = model.get_decoder().layers
    return dict(
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        num_q_heads=heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        layer_devices=[next(layer.parameters()).device for layer in layers],
        dtype=model.dtype,
    )


def rope_inv_freq(model) -> torch.Tensor:
    """The model's RoPE frequencies (R/2,), for re-rotating kept keys (policy.rerotate=true).

    Only position-independent RoPE composes as a rotation: no attention scaling of cos/sin and no
    frequencies that change with the sequence length (dynamic / longrope types).
    """
    rope = getattr(model.get_decoder(), "rotary_emb", None)
    kind = getattr(rope, "rope_type", None)
    if rope is None or getattr(rope, "attention_scaling", 1.0) != 1.0 or kind in ("dynamic", "longrope"):
        raise ValueError(f"policy.rerotate=true needs plain RoPE (this model's: {kind}); set policy.rerotate=false")
    return rope.inv_freq


NOT_A_ROTATION = ("dynamic", "longrope", "yarn")  # RoPE types whose cos/sin change with the length or are scaled


def rope_problem(config) -> str | None:
    """Why re-rotation cannot work with this model config (None: plain RoPE, rotations compose)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kind = params.get("rope_type") or params.get("type") or "default"
    return f"this model's RoPE is {kind}, not a plain rotation" if kind in NOT_A_ROTATION else None
