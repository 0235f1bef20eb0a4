"""The threshold head rule (`head_budget=threshold`): DMS's (Łańcucki et al., 2025, arXiv 2506.05345) as kvpress 0.5.5's
`DMSPress` applies it over a scorer (the leaderboard's `kvzap_mlp` = DMSPress(KVzapPress("mlp"))): a pair out of
the newest `policy.sliding_window` positions is evicted when its score is below `policy.threshold`; no sinks, no
budget. Each (layer, sample, KV head) then keeps its own count, which depends on the data.

Counts, for one (layer, sample, head) ranked as the cache's eviction ranks it (the newest window +inf, empty slots
and holes -inf): the pairs ranked >= threshold. Each head then keeps exactly those (its c best). Pure and
vectorised over layers, samples and heads.

When it decides (the budget the schedule evicts on, `budgets`): schedule=after_prefill, once at the first decode
step (DMS decoding=False, exact); the other schedules, whenever `evict_every` pairs have left the window (the budget
window + evict_every, kept down to the window): DMS decoding=True decides each pair as it leaves the window, which
is the same pairs at evict_every=1 and, from a score fixed at arrival, the same decision later (a kept pair is
never evicted afterwards). Only a policy whose score is stored once at arrival (it declares `threshold` and
`sliding_window`: KVzap) can run it: a score recomputed at each eviction would decide a pair again and again on a
moving value, and a threshold needs a score on a known scale (KVzap's log-scores).

What the engine needs: a score (`needs_score`), heads holding different counts (`uneven`), each head at most every
pair its sample holds (`slots`), and the memory account charges that bound (`data_dependent`: nothing below the
threshold, the cache as without eviction); the record carries the share really kept (`kv_kept_share`).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from kvbench.budgets.rule import HeadRule
from kvbench.errors import ConfigError

TRANSIENT_BYTES = 1 + 8  # the comparison (bool), the counts (int64)


def threshold_counts(ranked: torch.Tensor, threshold: float) -> torch.Tensor:
    """(L, B, H) pairs each head keeps: those ranked >= threshold (protected +inf included), never an empty slot or
    a hole (-inf, even at threshold -inf). `ranked` (L, B, H, N) as the cache's `select` ranks it."""
    return ((ranked >= threshold) & (ranked > -math.inf)).sum(dim=-1)


class ThresholdHeads(HeadRule):
    name: ClassVar[str] = "threshold"
    needs_score: ClassVar[bool] = True
    once_only: ClassVar[bool] = False  # after_prefill: once; the other schedules: as pairs leave the window
    uneven: ClassVar[bool] = True
    data_dependent: ClassVar[bool] = True
    transient: ClassVar[int] = TRANSIENT_BYTES

    def validate(self, policy) -> None:
        hb = policy.head_budget
        if not hasattr(policy, "threshold"):
            raise ConfigError("policy.head_budget", f"{policy.name}'s score is not stored once at arrival: threshold "
                              "head budgets (DMS) need a score fixed per pair on a known scale (KVzap's)", hb)
        t, w = policy.threshold, policy.sliding_window
        if isinstance(t, bool) or not isinstance(t, (int, float)) or math.isnan(t):
            raise ConfigError("policy.threshold", "head_budget=threshold evicts pairs scored below it: set a number "
                              "(KVzap: a log-score, e.g. -5)", t)
        policy.threshold = float(t)
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ConfigError("policy.sliding_window", "must be a positive integer (the newest pairs DMS protects)", w)
        for key in ("kv_ratio", "compression_ratio"):
            if getattr(policy, key) is not None:
                raise ConfigError(f"policy.{key}", "sets a budget; head_budget=threshold keeps what scores at least "
                                  "policy.threshold (the kept share depends on the data): set one", getattr(policy, key))
        if policy.protect_recent != 0:
            raise ConfigError("policy.protect_recent", "head_budget=threshold protects policy.sliding_window newest "
                              "pairs (DMS's window): use that", policy.protect_recent)
        if policy.rerotate:
            raise ConfigError("policy.head_budget", "threshold head budgets give heads different counts; "
                              "policy.rerotate needs one count (rotary positions are shared)", hb)
        policy.kv_size = None  # the threshold replaces the budget (as kv_ratio replaces kv_size)

    def budgets(self, policy, lengths: list[int]) -> torch.Tensor:
        """(B,) what the schedule evicts on: the window (after_prefill: a prompt longer than it is decided once),
        else the window + evict_every (pairs are decided whenever evict_every of them have left the window)."""
        k = policy.sliding_window + (0 if policy.once else policy.evict_every)
        return torch.full((len(lengths),), k, dtype=torch.long, device="cpu")

    def recent(self, policy) -> int:
        return policy.sliding_window

    def slots(self, policy, pairs, heads: int | None):
        """A head may keep every pair its sample holds: unbounded here, the prompt's length in the cache."""
        big = 1 << 40
        return torch.full_like(pairs, big) if isinstance(pairs, torch.Tensor) else big

    def counts(self, policy, ranked: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return threshold_counts(ranked, policy.threshold)

    def extensions(self, policy) -> list[str]:
        ext = [f"head_budget=threshold: DMS's rule (kvpress's DMSPress): a pair older than the newest "
               f"{policy.sliding_window} is evicted when its score < {policy.threshold:g}; per-head counts depend on "
               "the data (kv_kept_share records what was kept); the memory account charges the bound (nothing "
               "evicted), the static cache shrinks to what its largest head kept at its first decision while decoding"]
        if not policy.once:
            ext.append(f"pairs are decided every evict_every={policy.evict_every} tokens once they left the window "
                       "(DMS decoding=True decides each one as it leaves: the same pairs at evict_every=1)")
        return ext
