"""KeyDiff: keep the keys least similar to the head's mean key (Park et al., 2025).

Per (layer, KV head, sample): anchor = mean of the unit-normalised keys held; score = minus the
cosine similarity of each key to the anchor (distinct keys are kept). Attention-free (`needs_keys`);
the anchor is taken over the pairs held at the eviction (the whole prompt at decode_only's first
compression, like kvpress's KeyDiffPress; the kv_size pairs held under prefill_and_decode).
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.policies.knorm import key_norms
from kvbench.policies.policy import AFTER_PREFILL, Needs, Policy, ScoreContext


@dataclass
class KeyDiff(Policy):
    kv_size: int | None = 256
    evict_every: int = 64
    schedule: str = "decode_only"
    name: ClassVar[str] = "keydiff"
    label: ClassVar[str] = "KeyDiff"
    summary: ClassVar[str] = "keys least similar (cosine) to the head's mean key"
    paper: ClassVar[tuple[str, str]] = ("Park et al., 2025", "https://arxiv.org/abs/2504.15364")
    published_schedule: ClassVar[str] = AFTER_PREFILL
    needs: ClassVar[Needs] = Needs(keys=True)

    def score(self, stats: ScoreContext) -> torch.Tensor:
        k = stats.keys  # (L, B, H, N, D), a strided view of the cache
        N = k.shape[3]
        norm = key_norms(k).clamp_min(1e-12)  # (L, B, H, N), upcast one layer at a time
        valid = torch.arange(N, device=k.device) < stats.n  # (1, B, 1, N): slots >= n are empty
        w = (valid / norm / valid.sum(-1, keepdim=True)).to(k.dtype)  # mean of the unit keys, as weights
        anchor = (w.unsqueeze(-2) @ k).float()  # (L, B, H, 1, D)
        cos = (k @ anchor.to(k.dtype).transpose(-1, -2)).squeeze(-1).float()  # (L, B, H, N)
        cos = cos / (norm * torch.linalg.vector_norm(anchor, dim=-1).clamp_min(1e-12))
        return -cos

    def score_bytes(self, *, layers, rows, kv_heads, q_heads, pairs, head_dim, elem) -> int:
        half = rows * kv_heads * pairs * head_dim * 4 if elem != 4 else 0  # one layer's float32 keys for the norm
        return half + 4 * layers * rows * kv_heads * pairs * 4  # norm, weights, cosine, its quotient
