"""Model introspection for the account: the few numbers of a loaded model the memory account needs.

`ModelShape.of(model)` reads the configuration through the family's adapter (heads, head size, sliding
windows, sinks or soft-capping) and the parameters where they live (bytes per device, decoder layers per
device, accelerate's offloaded layers). It is the only part of kvbench.memory that looks at a model; the
account (`kvbench.memory.accounting`) is arithmetic on this shape, which is why the capacity planner can take it
from a model built on the meta device (no weights) and place its layers itself (`kvbench.capacity.placed_shape`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from kvbench.models.family import kinds
from kvbench.models.geometry import layer_device


@dataclass(frozen=True)
class ModelShape:
    """The model numbers the account needs."""

    hidden: int
    intermediate: int
    vocab: int
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    mlp_buffers: int  # (B, T, I) tensors alive in the MLP
    fused_qkv: bool  # Phi-3: q, k, v are views of one projection, alive through the attention
    weights: dict[str, int]  # bytes per device
    layers: dict[str, int]  # decoder layers per device (where they compute: accelerate's execution device)
    windows: tuple = ()  # per decoder layer: its sliding window W, None for full attention (() : none windowed)
    manual: bool = False  # learned sinks or logit soft-capping: the fused (or eager) attention, never SDPA / flash
    onload: dict[str, int] = field(default_factory=dict)  # the largest offloaded layer's weights per device
    linear: tuple = ()  # a hybrid's linear-attention layers (no K/V; kvbench.models.family.hybrid)
    state_bytes_per_sequence: int = 0  # their conv + recurrent states, per sequence, whatever its length
    kv_quant: object = None  # gen.kv_cache_dtype's settings (kvbench.quant.qconfig.KVQuant); None: the model dtype
    shapes: tuple | None = None  # per decoder layer (H_kv, D) where layers differ (Gemma 4); kv_heads, head_dim: the most
    name: str = ""  # the model's name_or_path (KVzap's published scorer is the model's: `Policy.weight_bytes`)

    def of_layer(self, layer: int) -> ModelShape:
        """This shape with `layer`'s KV heads and head size (a group of the cache holds layers of one shape)."""
        return self if self.shapes is None else replace(self, kv_heads=self.shapes[layer][0], head_dim=self.shapes[layer][1])

    @property
    def elem(self) -> int:
        """Bytes per element of the model dtype (e in the account's formulas)."""
        return torch.empty((), dtype=self.dtype, device="cpu").element_size()

    @classmethod
    def of(cls, model, k=None) -> ModelShape:
        """The shape of a loaded model (a refused family raises ConfigError through its adapter; `k`: its kinds
        when already read)."""
        cfg = model.config
        k = kinds(cfg) if k is None else k  # the family's adapter: heads, head size, windows (a refused family raises ConfigError)
        decoder_layers = model.get_decoder().layers
        weights: dict[str, int] = {}
        dispatched = getattr(model, "hf_device_map", None) is not None  # accelerate: meta = offloaded (CPU RAM, disk)
        for t in [*model.parameters(), *model.buffers()]:  # tied weights are yielded once
            if not (dispatched and t.device.type == "meta"):  # offloaded weights are no device's
                weights[str(t.device)] = weights.get(str(t.device), 0) + t.numel() * t.element_size()
        layers: dict[str, int] = {}
        onload: dict[str, int] = {}
        for layer in decoder_layers:
            d = str(layer_device(layer))
            layers[d] = layers.get(d, 0) + 1
            if dispatched and d != "meta":  # an offloaded layer's weights, on its device for its forward
                off = sum(p.numel() * p.element_size() for p in layer.parameters() if p.device.type == "meta")
                onload[d] = max(onload.get(d, 0), off)
        return cls(
            hidden=cfg.hidden_size,
            intermediate=getattr(cfg, "intermediate_size", None) or max(  # Qwen3.5-MoE: experts + a shared one only
                cfg.moe_intermediate_size, getattr(cfg, "shared_expert_intermediate_size", 0) or 0),
            vocab=cfg.vocab_size,
            q_heads=k.q_heads,
            kv_heads=k.kv_heads,
            head_dim=k.head_dim,
            dtype=model.dtype,
            mlp_buffers=4 if hasattr(decoder_layers[0].mlp, "gate_up_proj") else 3,
            fused_qkv=hasattr(decoder_layers[next(i for i in range(len(decoder_layers)) if i not in k.linear)].self_attn,
                              "qkv_proj"),
            weights=weights,
            layers=layers,
            windows=k.windows,
            manual=k.sinks or k.softcap is not None,
            onload={d: b for d, b in onload.items() if b},
            linear=k.linear,
            state_bytes_per_sequence=0 if k.state is None else k.state.bytes_per_sequence(model.dtype),
            shapes=k.shapes,
            name=getattr(cfg, "name_or_path", "") or "",
        )
