"""The pattern head rule (`head_budget=pattern`): a fixed per-(layer, KV head) pattern, DuoAttention's (Xiao et al.,
2024, arXiv 2410.10819): a retrieval head keeps every pair it holds, a streaming head its `sink_size` first and
`recent_size` newest pairs (kvpress 0.5.5's `DuoAttentionPress`: pairs [sink, n - recent) of a streaming head go).

The policy's score says which head is which (kvbench.policies.duo_attention): every pair of a retrieval head and
a streaming head's sinks are marked +inf (kept), its other pairs ranked by position (newer = keep). The rule's
counts are then per head: its +inf pairs, and at least min(held, `policy.window`) (= sink_size + recent_size), so
a retrieval head keeps all, a streaming head its sinks and its newest pairs up to the window. Pure: ranked scores in,
counts out; vectorised over layers, samples and heads.

What the engine needs (as AdaKV's rule): a score (`needs_score`), one choice when the prompt is compressed
(`once_only`: schedule=after_prefill; the heads then grow by one pair per generated token, kvpress's protocol),
heads holding different counts (`uneven`), and each head at most every pair its sample holds (`slots`: the cache
holds the largest head's, a retrieval head's; serve mode frees a streaming head's pages).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from kvbench.budgets.rule import HeadRule
from kvbench.errors import ConfigError

INF = float("inf")
TRANSIENT_BYTES = 2 + 8 + 8  # the two comparisons (bool), their counts (int64)


def pattern_counts(ranked: torch.Tensor, window: int) -> torch.Tensor:
    """(..., H) pairs each head keeps: its +inf pairs, at least min(its held pairs, window). `ranked` (..., H, N):
    kept pairs +inf, empty slots -inf (as the cache's `select` ranks them)."""
    held = (ranked > -INF).sum(dim=-1)
    marked = (ranked == INF).sum(dim=-1)
    return torch.maximum(marked, held.clamp(max=window))


class PatternHeads(HeadRule):
    name: ClassVar[str] = "pattern"
    needs_score: ClassVar[bool] = True
    once_only: ClassVar[bool] = True
    uneven: ClassVar[bool] = True
    transient: ClassVar[int] = TRANSIENT_BYTES

    def validate(self, policy) -> None:
        hb = policy.head_budget
        if not hasattr(policy, "window"):
            raise ConfigError("policy.head_budget", f"{policy.name} has no head pattern (DuoAttention's)", hb)
        if not policy.once:
            raise ConfigError("policy.head_budget", "pattern head budgets cut the streaming heads once, when the "
                              "prompt is compressed: use policy.schedule=after_prefill", hb)
        if policy.rerotate:
            raise ConfigError("policy.head_budget", "pattern head budgets give heads different counts; "
                              "policy.rerotate needs one count (rotary positions are shared)", hb)

    def slots(self, policy, pairs, heads: int | None):
        """A retrieval head keeps every pair its sample holds: unbounded here, the prompt's length in the cache."""
        big = 1 << 40
        return torch.full_like(pairs, big) if isinstance(pairs, torch.Tensor) else big

    def counts(self, policy, ranked: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return pattern_counts(ranked, policy.window)

    def extensions(self, policy) -> list[str]:
        return ["head_budget=pattern: retrieval heads keep every pair, streaming heads their sinks and newest pairs "
                "(DuoAttention's pattern); the static cache holds each layer's largest head (a retrieval head's), "
                "serve mode frees each streaming head's pages (kvpress keeps every pair and masks the evicted keys)"]
