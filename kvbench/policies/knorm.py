"""Knorm: keep the pairs whose keys have the LOWEST L2 norm (Devoto et al., 2024: a low key norm goes
with a high attention weight). Attention-free: it reads the cached keys only (`needs_keys`).

RoPE rotates pairs of dimensions, so a stored (rotated) key has its pre-RoPE norm: re-rotation and
positions change nothing. Published as a one-off compression after prefill (kvpress's KnormPress);
under kvbench's schedules it also evicts while decoding, and under prefill_and_decode during prefill
(both listed in `extensions`).
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.policies.policy import AFTER_PREFILL, Needs, Policy, ScoreContext


@dataclass
class Knorm(Policy):
    kv_size: int | None = 256
    evict_every: int = 64
    schedule: str = "decode_only"
    name: ClassVar[str] = "knorm"
    label: ClassVar[str] = "Knorm"
    summary: ClassVar[str] = "keys with the lowest L2 norm"
    paper: ClassVar[tuple[str, str]] = ("Devoto et al., EMNLP 2024", "https://arxiv.org/abs/2406.11430")
    published_schedule: ClassVar[str] = AFTER_PREFILL
    needs: ClassVar[Needs] = Needs(keys=True)

    def score(self, stats: ScoreContext) -> torch.Tensor:
        return -key_norms(stats.keys)  # (L, B, H, N): low norm = keep

    def score_bytes(self, *, layers, rows, kv_heads, q_heads, pairs, head_dim, elem) -> int:
        return rows * kv_heads * pairs * head_dim * 4 if elem != 4 else 0  # one layer's keys in float32


def key_norms(keys: torch.Tensor) -> torch.Tensor:
    """L2 norms (L, B, H, N) in float32 of keys (L, B, H, N, D), one layer at a time: half-precision keys are
    upcast one layer at a time (a float32 copy of the whole cache would double a half-precision cache's
    memory, halving the policy's largest batch for an implementation detail)."""
    out = torch.empty(keys.shape[:-1], dtype=torch.float32, device=keys.device)
    for layer in range(keys.shape[0]):
        out[layer] = torch.linalg.vector_norm(keys[layer].float(), dim=-1)
    return out
