"""Hybrid linear-attention models (Qwen3.5 dense and MoE, Qwen3-Next): Gated-DeltaNet layers beside full attention.

A `linear_attention` layer keeps a fixed state per sequence, whatever its length (transformers 5.x
`LinearAttentionLayer`, filled by the model's own `Qwen3_5GatedDeltaNet`):

    conv state        (B, conv_dim, K)            model dtype; conv_dim = 2 Hk dk + Hv dv, K = linear_conv_kernel_dim
    recurrent state   (B, Hv, dk, dv)             float32 whatever the model dtype (the gated delta rule's state)

so per sequence and linear layer: conv_dim K e + Hv dk dv 4 bytes. Only the attention layers hold K/V, grow with
the sequence and can be evicted; the memory account and `kvbench-plan` count this state apart from the KV.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.models.family.table import LINEAR_KINDS


@dataclass(frozen=True)
class LinearState:
    """The linear-attention layers of a hybrid model and their state geometry (per sequence)."""

    layers: tuple[int, ...]  # the decoder layers with a linear-attention state
    conv_dim: int
    kernel: int
    v_heads: int
    k_dim: int
    v_dim: int

    def bytes_per_layer(self, dtype: torch.dtype) -> int:
        """One sequence's state in one linear layer: its conv state (model dtype) and recurrent state (float32)."""
        e = torch.empty((), dtype=dtype, device="meta").element_size()
        return self.conv_dim * self.kernel * e + self.v_heads * self.k_dim * self.v_dim * 4

    def bytes_per_sequence(self, dtype: torch.dtype) -> int:
        """One sequence's state over every linear layer."""
        return len(self.layers) * self.bytes_per_layer(dtype)


def linear_state(cfg) -> LinearState | None:
    """The state of a hybrid model's linear layers, from its (text) config; None without linear layers."""
    layers = tuple(i for i, k in enumerate(getattr(cfg, "layer_types", None) or []) if k in LINEAR_KINDS)
    if not layers:
        return None
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    return LinearState(layers=layers, conv_dim=2 * hk * dk + hv * dv, kernel=cfg.linear_conv_kernel_dim, v_heads=hv,
                       k_dim=dk, v_dim=dv)
