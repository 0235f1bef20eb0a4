"""Pre-RoPE queries and keys from a layer's hidden states, and the rotary embedding at any position.

For policies that declare `needs.hidden`/`needs.module` (kvbench.policies.needs), as kvpress's
`get_prerope_query_states` / `get_prerope_key_states` compute them:

    queries(module, hidden)  (B, Hq, T, D): q_proj(h) viewed per head, then q_norm where the family has one
                             (Qwen3, Gemma3); Phi-3: the first Hq*D columns of the fused qkv_proj
    keys(module, hidden)     (B, H_kv, T, D): the same with k_proj / k_norm (Phi-3: the next H_kv*D columns)
    cos_sin(rotary, positions, like)  (B, T, D) each: the model's rotary embedding (attention_scaling included)
                             at arbitrary (e.g. future) positions (B, T)
    rotate(x, cos, sin)      RoPE applied: x * cos + rotate_half(x) * sin (x (..., T, D), cos/sin broadcast)
"""

from __future__ import annotations

import torch


def _heads(module) -> tuple[int, int, int]:
    cfg = module.config
    D = getattr(module, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads, D


def queries(module, hidden: torch.Tensor) -> torch.Tensor:
    """(B, Hq, T, D) pre-RoPE queries of hidden (B, T, hidden)."""
    B, T, _ = hidden.shape
    Hq, _, D = _heads(module)
    q = module.q_proj(hidden) if hasattr(module, "q_proj") else module.qkv_proj(hidden)[..., : Hq * D]
    q = q.view(B, T, Hq, D).transpose(1, 2)
    return module.q_norm(q) if getattr(module, "q_norm", None) is not None else q


def keys(module, hidden: torch.Tensor) -> torch.Tensor:
    """(B, H_kv, T, D) pre-RoPE keys of hidden (B, T, hidden)."""
    B, T, _ = hidden.shape
    Hq, H, D = _heads(module)
    k = module.k_proj(hidden) if hasattr(module, "k_proj") else module.qkv_proj(hidden)[..., Hq * D: (Hq + H) * D]
    k = k.view(B, T, H, D).transpose(1, 2)
    return module.k_norm(k) if getattr(module, "k_norm", None) is not None else k


def cos_sin(rotary, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary embedding's (cos, sin) (B, T, D) at positions (B, T), in `like`'s dtype and device."""
    return rotary(like, positions.to(like.device))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE: x * cos + rotate_half(x) * sin."""
    return x * cos + rotate_half(x) * sin
