"""Pre-RoPE queries and keys from a layer's hidden states, and the model's RoPE as a matrix at any position.

For policies that declare `needs.hidden`/`needs.module` (kvbench.policies.needs), as kvpress's
`get_prerope_query_states` / `get_prerope_key_states` compute them, on every family kvbench runs:

    queries(module, hidden)  (B, Hq, T, D): q_proj(h) viewed per head, then q_norm where the family has one
                             (Qwen3, Gemma 3: per head; OLMo 2/3: over the whole projection, before the view);
                             Phi-3: the first Hq*D columns of the fused qkv_proj; Qwen3.5 / Qwen3-Next: each head's
                             query half of q_proj (the other half gates the output)
    keys(module, hidden)     (B, H_kv, T, D): the same with k_proj / k_norm (Phi-3: the next H_kv*D columns); the
                             layer's own H_kv and D (Gemma 4's global layers differ from its sliding ones)
    cos_sin(rotary, positions, like, module)  the model's rotary embedding (attention_scaling included) at
                             arbitrary (e.g. future) positions (B, T), for the module's layer type where the
                             embedding has one per type (Gemma 3)
    apply(module, x, cos, sin)  x (B, H, T, D) with the layer's RoPE: the model's own `apply_rotary_pos_emb`
    rotation(module, cos, sin)  (..., D, D) R with RoPE(q) = R q, as the layer applies it: `apply` on the
                             identity, so partial RoPE (GLM-4, Phi-4-mini, Qwen3.5:
                             the first R dims rotate, the others pass through), interleaved pairs (GLM-4, Cohere)
                             and NoPE layers (the identity) are the model's; linear in (cos, sin), so averaged
                             cos/sin give the average of the matrices
    rotate(x, cos, sin)      rotate-half RoPE on every dim: x * cos + rotate_half(x) * sin (x (..., T, D))
"""

from __future__ import annotations

import inspect
import sys

import torch

from kvbench.models.family import nope_layers


def _heads(module) -> tuple[int, int, int]:
    """(Hq, H_kv, D) of this layer (its projections' widths: Gemma 4's layers differ in H_kv and D)."""
    cfg = module.config
    D = getattr(module, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    Hq = cfg.num_attention_heads
    if hasattr(module, "k_proj"):
        return Hq, module.k_proj.out_features // D, D
    return Hq, getattr(cfg, "num_key_value_heads", None) or Hq, D


def _project(module, hidden, name: str, heads: int, D: int, cols: slice) -> torch.Tensor:
    """(B, heads, T, D): `name`_proj of hidden (or the fused qkv_proj's `cols`), normed as the layer norms it."""
    B, T, _ = hidden.shape
    proj = getattr(module, f"{name}_proj", None)
    x = proj(hidden) if proj is not None else module.qkv_proj(hidden)[..., cols]
    norm = getattr(module, f"{name}_norm", None)
    whole = norm is not None and heads > 1 and getattr(norm, "weight", torch.empty(0)).shape[-1] == heads * D
    if whole:  # OLMo 2/3: one norm over the whole projection, before the view
        x = norm(x)
    if x.shape[-1] == 2 * heads * D:  # Qwen3.5 / Qwen3-Next: per head, the query then the output gate
        x = x.view(B, T, heads, 2 * D)[..., :D]
    x = x.reshape(B, T, heads, D).transpose(1, 2)
    return norm(x) if norm is not None and not whole else x


def queries(module, hidden: torch.Tensor) -> torch.Tensor:
    """(B, Hq, T, D) pre-RoPE queries of hidden (B, T, hidden)."""
    Hq, _, D = _heads(module)
    return _project(module, hidden, "q", Hq, D, slice(0, Hq * D))


def keys(module, hidden: torch.Tensor) -> torch.Tensor:
    """(B, H_kv, T, D) pre-RoPE keys of hidden (B, T, hidden)."""
    Hq, H, D = _heads(module)
    return _project(module, hidden, "k", H, D, slice(Hq * D, (Hq + H) * D))


def cos_sin(rotary, positions: torch.Tensor, like: torch.Tensor, module=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary embedding's (cos, sin) (B, T, C) at positions (B, T), in `like`'s dtype and device (C: the rotary
    dims, D/2 for gpt-oss's halves); `module`'s layer type where the embedding takes one."""
    if "layer_type" in inspect.signature(rotary.forward).parameters:
        return rotary(like, positions.to(like.device), getattr(module, "layer_type", None) or "full_attention")
    return rotary(like, positions.to(like.device))


def apply(module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, D) with the layer's RoPE at (cos, sin) (B, T, C): the model's own `apply_rotary_pos_emb` (x as is
    on a NoPE layer; rotate-half on the first C dims where the family's module has no such function)."""
    if module.layer_idx in nope_layers(module.config):
        return x
    fn = getattr(sys.modules[type(module).__module__], "apply_rotary_pos_emb", None)
    if fn is None:
        C = cos.shape[-1]
        return torch.cat([rotate(x[..., :C], cos[:, None], sin[:, None]), x[..., C:]], dim=-1)
    if "x" in inspect.signature(fn).parameters:  # Gemma 4: one tensor
        return fn(x, cos, sin)
    return fn(x, x, cos, sin)[0]  # (q, k, cos, sin) (a hub-kernel wrapper shows (*args, **kwargs))


def rotation(module, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """(..., D, D) float32: the layer's RoPE at (cos, sin) (..., C) as a matrix R, RoPE(q) = R q (the identity on a
    NoPE layer): `apply` on the rows of the identity."""
    D = _heads(module)[2]
    lead = cos.shape[:-1]
    c, s = cos.float().reshape(-1, 1, cos.shape[-1]), sin.float().reshape(-1, 1, sin.shape[-1])  # (M, T=1, C)
    rows = torch.eye(D, device=cos.device).expand(c.shape[0], 1, D, D)  # (M, 1 head, D rows as tokens, D)
    return apply(module, rows, c, s)[:, 0].transpose(-1, -2).reshape(*lead, D, D)  # column j = RoPE(e_j)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE: x * cos + rotate_half(x) * sin."""
    return x * cos + rotate_half(x) * sin
