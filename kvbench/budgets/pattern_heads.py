"""The pattern head rule (`head_budget=pattern`): a fixed per-(layer, KV head) pattern, DuoAttention's (Xiao et al.,
2024, arXiv 2410.10819): a retrieval head keeps every pair it holds, a streaming head its `sink_size` first and
`recent_size` newest pairs (kvpress 0.5.5's `DuoAttentionPress`: pairs [sink, n - recent) of a streaming head go).

The policy's score says which head is which (kvbench.policies.duo_attention): every pair of a retrieval head and
a streaming head's sinks are marked +inf (kept), its other pairs ranked by position (newer = keep). The rule's
counts are then per head: its +inf pairs, and at least min(held, keep), so a retrieval head keeps all, a
streaming head its sinks and its newest pairs up to what the eviction keeps (`keep`: the window under
after_prefill, window - evict_every under the other schedules, so a streaming head slides as tokens arrive).
Pure: ranked scores in, counts out; vectorised over layers, samples and heads.

What the engine needs (as AdaKV's rule): a score (`needs_score`), heads holding different counts (`uneven`: each
head's hole masked, kvbench.cache.heads), and each head at most every pair its sample holds (`slots`: the cache
holds the largest head's, a retrieval head's). Serving needs no score to know the counts: each (layer, KV head)'s
budget is fixed by the pattern (`head_budgets`: a retrieval head the whole request, a streaming head its window), so
a streaming head frees its own pages as the request grows, under every schedule.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from kvbench.budgets.rule import HeadRule
from kvbench.errors import ConfigError

INF = float("inf")
TRANSIENT_BYTES = 2 + 8 + 8  # the two comparisons (bool), their counts (int64)


def pattern_counts(ranked: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """(L, B, H) pairs each head keeps: its +inf pairs, at least min(its held pairs, keep_b). `ranked` (L, B, H, N):
    kept pairs +inf, empty slots and holes -inf (as the cache's `select` ranks them); keep (B,) on its device."""
    held = (ranked > -INF).sum(dim=-1)
    marked = (ranked == INF).sum(dim=-1)
    return torch.maximum(marked, torch.minimum(held, keep.to(held.device)[None, :, None]))


class PatternHeads(HeadRule):
    name: ClassVar[str] = "pattern"
    needs_score: ClassVar[bool] = True
    once_only: ClassVar[bool] = False  # after_prefill: once; the other schedules: at every eviction
    uneven: ClassVar[bool] = True
    fixed: ClassVar[bool] = True
    transient: ClassVar[int] = TRANSIENT_BYTES

    def validate(self, policy) -> None:
        hb = policy.head_budget
        if not hasattr(policy, "window"):
            raise ConfigError("policy.head_budget", f"{policy.name} has no head pattern (DuoAttention's)", hb)
        if policy.rerotate:
            raise ConfigError("policy.head_budget", "pattern head budgets give heads different counts; "
                              "policy.rerotate needs one count (rotary positions are shared)", hb)

    def slots(self, policy, pairs, heads: int | None):
        """A retrieval head keeps every pair its sample holds: unbounded here, the prompt's length in the cache."""
        big = 1 << 40
        return torch.full_like(pairs, big) if isinstance(pairs, torch.Tensor) else big

    def head_budgets(self, policy, config, fetch: bool = True):
        """request -> (L, H): a retrieval head everything the request will hold (it never evicts), a streaming head
        `policy.window` (after_prefill: at most the prompt, as the streaming layer rule)."""
        retrieval = policy.retrieval_heads(config, fetch)  # (L, H) bool, or None: not without the Hub or weights
        if retrieval is None:
            return None
        retrieval = retrieval.cpu()

        def budget(req) -> torch.Tensor:
            n = len(req.prompt)
            return torch.where(retrieval, n + req.max_new_tokens, min(n, policy.window) if policy.once else policy.window)
        return budget

    def counts(self, policy, ranked: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return pattern_counts(ranked, keep)

    def extensions(self, policy) -> list[str]:
        return ["head_budget=pattern: retrieval heads keep every pair, streaming heads their sinks and newest pairs "
                "(DuoAttention's pattern); the static cache holds each layer's largest head (a retrieval head's), "
                "serve mode frees each streaming head's pages (kvpress keeps every pair and masks the evicted keys)"]
