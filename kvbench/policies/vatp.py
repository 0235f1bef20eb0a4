"""VATP (value-aware token pruning): H2O's accumulated attention times the L1 norm of each pair's value (Guo,
Kamigaito, Watanabe, EMNLP 2024, "Attention Score is not All You Need for Token Importance Indicator in KV Cache
Reduction: Value Also Matters"). A pair that receives attention but writes a small value adds little to the output.

score = sum_w * ||v||_1 per (layer, KV head, pair): `sum_w` is the attention the pair received from every query so
far (on GQA models the mean over the query heads of its KV group), `v` the cached value. The rest is H2O's: one
pair per decode step, the newest half of the budget protected (`protect_recent=null`). The first pairs are not
protected by default: set `protect_first` to keep them.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.policies.h2o import H2O
from kvbench.policies.policy import Needs, ScoreContext


@dataclass
class VATP(H2O):
    name: ClassVar[str] = "vatp"
    label: ClassVar[str] = "VATP"
    summary: ClassVar[str] = "attention received, summed, times the value's L1 norm; the newest half protected"
    paper: ClassVar[tuple[str, str]] = ("Guo et al., EMNLP 2024", "https://arxiv.org/abs/2406.12335")
    needs: ClassVar[Needs] = Needs(attention=True, values=True)

    def score(self, ctx: ScoreContext) -> torch.Tensor:
        v = ctx.values  # (L, B, H, N, D), a strided view of the cache
        out = torch.empty(v.shape[:-1], dtype=torch.float32, device=v.device)  # (L, B, H, N)
        for layer in range(v.shape[0]):  # half-precision values upcast one layer at a time
            out[layer] = torch.linalg.vector_norm(v[layer].float(), ord=1, dim=-1)
        return out.mul_(ctx.sum_w)

    def score_bytes(self, *, layers, rows, kv_heads, q_heads, pairs, head_dim, elem) -> int:
        return rows * kv_heads * pairs * head_dim * 4 if elem != 4 else 0  # one layer's values in float32
