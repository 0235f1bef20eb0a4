"""What kvbench reads off a loaded decoder-only model (Llama / Phi-3 style): its cache geometry and RoPE.

Used by the static engine (kvbench.engine) and the serving engine (kvbench.serve) alike.
"""

from __future__ import annotations

import torch

from kvbench.models.family import NOT_A_ROTATION, kinds, rope_problem


def model_geometry(model, k=None) -> dict:
    """Cache geometry of a decoder-only transformers model, from its family's adapter (kvbench.models.family; `k`:
    its kinds when already read): heads, head size, each layer's device and sliding window (None: full attention)."""
    k = kinds(model.config) if k is None else k
    layers = model.get_decoder().layers
    return dict(
        num_kv_heads=k.kv_heads if k.shapes is None else [h for h, _ in k.shapes],  # per layer where they differ
        num_q_heads=k.q_heads,
        head_dim=k.head_dim if k.shapes is None else [d for _, d in k.shapes],
        layer_devices=[layer_device(layer) for layer in layers],
        dtype=model.dtype,
        windows=list(k.windows),
        linear=list(k.linear),  # a hybrid's linear-attention layers (no K/V)
    )


def _hook_device(module) -> torch.device | None:
    """The execution device accelerate's hook gives `module` (None: no hook)."""
    hook = getattr(module, "_hf_hook", None)
    for h in getattr(hook, "hooks", None) or ([hook] if hook is not None else []):  # SequentialHook or one hook
        dev = getattr(h, "execution_device", None)
        if dev is not None:
            return torch.device("cuda", dev) if isinstance(dev, int) else torch.device(dev)
    return None


def layer_device(layer) -> torch.device:
    """Where decoder `layer` computes: accelerate's execution device when it is dispatched (an offloaded
    layer's parameters are on `meta` between forwards, its hook brings them to that device), else the device
    of its first parameter."""
    for m in layer.modules():  # the hook sits on the layer, or on its submodules for a finer device_map
        dev = _hook_device(m)
        if dev is not None:
            return dev
    return next(layer.parameters()).device


def rope_inv_freq(model) -> torch.Tensor:
    """The model's RoPE frequencies (R/2,), for re-rotating kept keys (policy.rerotate=true).

    Only position-independent RoPE composes as a rotation: no attention scaling of cos/sin, no
    frequencies that change with the sequence length (dynamic / longrope types), and every layer rotated
    the same way (kvbench.models.family.rope_problem, read from the config).
    """
    rope = getattr(model.get_decoder(), "rotary_emb", None)
    kind = getattr(rope, "rope_type", None)
    why = rope_problem(model.config)
    if rope is None or getattr(rope, "attention_scaling", 1.0) != 1.0 or kind in NOT_A_ROTATION or why:
        raise ValueError(f"policy.rerotate=true needs plain RoPE ({why or f'this model: {kind}'}); "
                         "set policy.rerotate=false")
    return rope.inv_freq
