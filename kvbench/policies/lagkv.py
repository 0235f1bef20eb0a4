"""LagKV (Liang et al., 2025): keep the pairs whose keys and values the NEXT partition's channel ranges
predict worst (lag-relative information), attention-free.

After `n_sink` sinks the pairs form partitions of `lag_size` (index-based, from the first non-sink). For a
pair of partition p, with p + 1 as its reference: x = (k - min_{p+1}) / (max_{p+1} - min_{p+1}) per channel
(min and max over the reference partition's pairs), sigma = the standard deviation of x over the D channels
(unbiased); the key score is softmax(sigma) over the partition, the same for the values, their mean; and the
score is its rank inside the partition / lag_size. The sinks and the tail (the last full partition, which has
no reference, and the remainder) score 1. A prompt shorter than n_sink + 2 lag_size: 1 for the sinks and
(i - n_sink) / (n - n_sink) after them (a sliding window). Defaults as kvpress's LagKVPress (sink 4, lag 128,
rank scores); token for token against kvpress 0.5.5 in results/crosscheck/ (`make crosscheck`).

Defined once, on the whole prompt (schedule=after_prefill, kvpress's protocol): its partitions are indices into
a contiguous prompt, which an eviction while running breaks (the paper's streaming variant scores a partition
once its successor arrives, which needs per-pair state kvbench does not keep); the other schedules are refused.

A channel constant over the reference partition (max = min: kvpress divides by zero, its NaN then decides the
whole partition's ranks) contributes x = 0: recorded in `extensions`. Computed in the keys' dtype, as kvpress,
one layer at a time.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.budgets import is_int
from kvbench.errors import ConfigError
from kvbench.policies.policy import AFTER_PREFILL, Needs, Policy, ScoreContext


@dataclass
class LagKV(Policy):
    kv_size: int | None = 256
    schedule: str = AFTER_PREFILL
    n_sink: int = 4
    lag_size: int = 128
    name: ClassVar[str] = "lagkv"
    label: ClassVar[str] = "LagKV"
    after_prefill_only: ClassVar[str | None] = ("partitions its pairs by their indices in the whole prompt, which "
                                                "evictions while running would break")
    summary: ClassVar[str] = ("pairs the next partition's channel ranges predict worst (rank in each partition of "
                              "`lag_size`), the sinks and the last partition kept")
    paper: ClassVar[tuple[str, str]] = ("Liang et al., 2025", "https://arxiv.org/abs/2504.04704")
    published_schedule: ClassVar[str] = AFTER_PREFILL  # kvpress's LagKVPress: the prompt compressed once
    needs: ClassVar[Needs] = Needs(keys=True, values=True)

    def validate(self) -> None:
        if not is_int(self.n_sink) or self.n_sink < 0:
            raise ConfigError("policy.n_sink", "must be an integer >= 0", self.n_sink)
        if not is_int(self.lag_size) or self.lag_size < 1:
            raise ConfigError("policy.lag_size", "must be an integer >= 1", self.lag_size)
        super().validate()

    def score(self, stats: ScoreContext) -> torch.Tensor:
        k, v = stats.keys, stats.values  # (L, B, H, N, D)
        L, B, H, N, D = k.shape
        s, lag = self.n_sink, self.lag_size
        i = torch.arange(N, device=k.device)  # (N,) slot = index in the prompt (slots >= n are empty)
        n = stats.n.view(1, B, 1, 1)
        long = n >= s + 2 * lag  # (1, B, 1, 1) kvpress: a shorter prompt scores a sliding window
        slide = ((i - s) / (n - s).clamp(min=1)).to(k.dtype).float()  # (1, B, 1, N)
        out = torch.where((i < s) | long, 1.0, slide).expand(L, B, H, N).clone()  # (L, B, H, N) float32
        parts = (N - s) // lag  # partitions the slots hold; the sample's own: (n - s) // lag
        if parts < 2:
            return out
        ranked = (n.view(B) - s) // lag - 1  # (B,) partitions with a complete successor
        p = torch.arange(parts - 1, device=k.device)
        scored = (long.view(B, 1) & (p[None] < ranked[:, None]))[:, None, :, None]  # (B, 1, P - 1, 1)
        end = s + (parts - 1) * lag
        for layer in range(L):
            rank = (lag_scores(k[layer], s, lag, parts) + lag_scores(v[layer], s, lag, parts)) / 2  # (B, H, P-1, lag)
            rank = (rank.argsort(dim=-1).argsort(dim=-1) / lag).to(k.dtype).float()
            mine = out[layer, :, :, s:end].view(B, H, parts - 1, lag)
            mine.copy_(torch.where(scored, rank, mine))
        return out

    def score_bytes(self, *, layers, rows, kv_heads, q_heads, pairs, head_dim, elem) -> int:
        if pairs < self.n_sink + 2 * self.lag_size:
            return 4 * rows * kv_heads * pairs * 4  # the sliding window's rows
        # one layer: the partitions' copy, x, and the float32 ranks (argsort's int64 twice)
        return 2 * rows * kv_heads * pairs * head_dim * elem + rows * kv_heads * pairs * (3 * 4 + 2 * 8)

    def describe(self, gqa: bool = False, paged: bool = False) -> dict:
        d = super().describe(gqa, paged)
        if self.evicts:
            d["extensions"].append("a channel constant over the reference partition contributes 0 to the spread "
                                   "(kvpress divides by zero)")
        return d


def lag_scores(x: torch.Tensor, s: int, lag: int, parts: int) -> torch.Tensor:
    """softmax over each partition of the channel spread of its pairs x (B, H, N, D), min-max scaled by the next
    partition's ranges: (B, H, parts - 1, lag), in x's dtype."""
    B, H, _, D = x.shape
    seg = x[:, :, s : s + parts * lag].reshape(B, H, parts, lag, D)
    ref, cur = seg[:, :, 1:], seg[:, :, :-1]
    lo, hi = ref.amin(dim=-2, keepdim=True), ref.amax(dim=-2, keepdim=True)  # (B, H, P-1, 1, D)
    span = hi - lo
    flat = span == 0
    scaled = (cur - lo).div_(span.masked_fill_(flat, 1)).masked_fill_(flat, 0)  # a constant channel: 0
    return scaled.std(dim=-1).softmax(dim=-1)  # (B, H, P-1, lag)
