"""CriticalKV (Feng et al., 2025): any registered policy's score (`inner`, SnapKV by default: kvpress's leaderboard
row `CriticalKVPress(SnapKVPress())`), rescaled by what each pair's value writes through the output projection.

Two stages, as kvpress 0.5.5's CriticalKVPress: each KV head first keeps its `first_stage_ratio` share of the
budget by the inner score alone (int((1 - compression_ratio) x n x first_stage_ratio) pairs, at least 1; at
kv_size or kv_ratio: int(budget x first_stage_ratio)); every other pair scores (inner + epsilon) x the mean over
the KV group's query heads of ||W_O^(h) v||_1 (the L1 norm of the value through that query head's o_proj
columns). The pairs the inner policy protects (SnapKV's observation window) score the layer's largest inner
score + 1, as kvpress's SnapKVPress gives its window. `critical_expected_attention`: inner=expected_attention with
`+policy.inner_args.use_vnorm=false` (kvpress's row).

Departures (in `extensions`): equal inner scores enter the first stage older first (kvpress: topk's order).
Defined once, on the whole prompt (schedule=after_prefill, kvpress's protocol: the first stage is a share of
that one compression's budget); the other schedules are refused, and so are adaptive head budgets
(CriticalAdaKV's own split).
"""

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.errors import ConfigError
from kvbench.policies.inner_score import Wrapper, raised_score
from kvbench.policies.kvzip_plus import value_out_norms
from kvbench.policies.policy import AFTER_PREFILL, Needs, ScoreContext


@dataclass
class Critical(Wrapper):
    epsilon: float = 1e-4
    first_stage_ratio: float = 0.5
    name: ClassVar[str] = "critical"
    no_loglikelihood: ClassVar[str | None] = "its first stage is a share of the one compression's budget"
    label: ClassVar[str] = "CriticalKV"
    summary: ClassVar[str] = "the inner policy's best first, then (inner score + eps) x ||W_O v||_1"
    paper: ClassVar[tuple[str, str]] = ("Feng et al., 2025", "https://arxiv.org/abs/2502.03805")
    published_schedule: ClassVar[str] = AFTER_PREFILL  # kvpress's CriticalKVPress: the prompt compressed once
    gqa_note: ClassVar[str] = "GQA models: the value's output norm is averaged over a KV group's query heads (as kvpress)"
    not_inner: ClassVar[tuple[str, ...]] = ("critical", "chunkkv", "full", "extreme_decode")  # wrappers, no score
    after_prefill_only: ClassVar[str | None] = "takes its first stage as a share of the one compression's budget"
    uniform_heads_only: ClassVar[str | None] = ("splits the budget evenly over KV heads (CriticalAdaKV's adaptive "
                                                "split is another rule)")

    def validate(self) -> None:
        if not 0 <= self.first_stage_ratio <= 1:
            raise ConfigError("policy.first_stage_ratio", "must be in [0, 1]", self.first_stage_ratio)
        super().validate()

    @property
    def needs(self) -> Needs:
        return dataclasses.replace(self._inner.needs, values=True, module=True)

    def first_stage(self, n: torch.Tensor) -> torch.Tensor:
        """(1, B, 1, 1) pairs each head keeps by the inner score alone, for samples holding n (1, B, 1, 1)."""
        f = self.first_stage_ratio
        if self.compression_ratio is not None:
            b = torch.floor((1 - self.compression_ratio) * n.double() * f)  # kvpress: int((1 - r) k_len f)
        elif self.kv_ratio is not None:
            b = torch.floor(torch.ceil(self.kv_ratio * n.double()) * f)
        else:
            b = torch.full_like(n, self.kv_size, dtype=torch.float64).mul_(f).floor_()
        return b.long().clamp(min=1 if f > 0 else 0)

    def score(self, stats: ScoreContext) -> torch.Tensor:
        g, real = raised_score(self._inner, stats)  # (L, B, H, N), (1, B, 1, N)
        L, B, H, N = g.shape
        order = g.masked_fill(~real, float("-inf")).argsort(dim=-1, descending=True, stable=True)
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(N, device=g.device).expand_as(order))
        first = rank < self.first_stage(stats.n)  # (L, B, H, N): each head's best by the inner score
        del order, rank
        w = torch.empty_like(g)
        for layer in range(L):  # one layer at a time: a KV head's (B, G, N, hidden) product alive
            o = stats.modules[layer].o_proj.weight
            G = o.shape[1] // (H * stats.values.shape[-1])
            w[layer] = value_out_norms(o, stats.values[layer], H, G, p=1).float().mean(2)  # (B, H, N)
        s = (g + self.epsilon) * w
        return torch.where(first, torch.finfo(torch.float32).max, s)

    def score_bytes(self, *, layers, rows, kv_heads, q_heads, pairs, head_dim, elem) -> int:
        """The inner score's transient, or after it: its raised copy, the ranks (int64) and first stage, the output
        norms and products, and one KV head's W_O v (B, G, N, hidden ~ H_q D) with its norms."""
        inner = self.inner_score_bytes(layers=layers, rows=rows, kv_heads=kv_heads, q_heads=q_heads, pairs=pairs,
                                       head_dim=head_dim, elem=elem)
        cells = layers * rows * kv_heads * pairs
        per_head = rows * (q_heads // kv_heads) * pairs * (q_heads * head_dim + 1) * elem
        return max(inner + 2 * cells * 4, cells * (5 * 4 + 2 * 8) + per_head)

    def describe(self, gqa: bool = False, paged: bool = False) -> dict:
        d = super().describe(gqa, paged)
        if self.evicts:
            d["extensions"].append("equal inner scores enter the first stage older first (kvpress: topk's order)")
        return d
