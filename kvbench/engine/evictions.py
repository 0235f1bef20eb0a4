"""The evictions before a forward: which groups of layers evict which rows, down to what, under the schedule
(kvbench.schedule) and the batch's budgets (kvbench.budgets); the cache does the eviction itself."""

from __future__ import annotations

import torch

from kvbench.budgets import knobs, question
from kvbench.cache import KVCache
from kvbench.cache.evict import trim_windows
from kvbench.policies.base import Policy
from kvbench.schedule import rows_to_evict


def evict_before_forward(cache: KVCache, r: torch.Tensor, policy: Policy, prefill: bool, observer,
                         first_decode: bool = False, max_new_tokens: int = 0) -> None:
    """Before a forward bringing r (B,) tokens: evict, group by group of layers (one group unless budgets differ
    by layer), the rows that need it; windowed layers only keep their window (`kvbench.cache.evict.trim_windows`),
    whatever the policy."""
    trim_windows(cache.groups, r, cache.gather_layers)
    if not policy.evicts:
        return
    evictions = [(g, rows_to_evict(g.load, r, policy, prefill, g.budget, first_decode)) for g in cache.groups
                 if g.sliding is None]  # (group, (B,) bool rows or None)
    evictions = [(g, rows) for g, rows in evictions if rows is not None]
    if not evictions:
        return
    with cache.timer("evict", cache.devices):
        for g, rows in evictions:
            cache.evict(rows, knobs.keep(policy, g.budget), policy, group=g)
            need = knobs.decode_capacity(policy, int(g.budget.max()), max_new_tokens, cache.heads)
            if not prefill and g.capacity > need and int(g.n.max()) < need:
                cache.resize(need, group=g)  # the prompt is compressed: give its memory back
    if observer:
        observer("evict", cache)


def compress_context(cache: KVCache, q: torch.Tensor, policy: Policy, observer, max_new_tokens: int) -> None:
    """Query-agnostic: before the question's q (B,) tokens come, compress the context as the schedule would at its
    end (after_prefill: to its budget; otherwise down to min(k - p, k - q_b) where n_b + q_b > k), so the
    question fits the budget and is not evicted before the first generated token."""
    trim_windows(cache.groups, q, cache.gather_layers)  # windowed layers keep their window, whatever the policy
    if not policy.evicts:
        return
    with cache.timer("evict", cache.devices):
        for g in cache.groups:
            if g.sliding is not None:
                continue
            k = torch.as_tensor(policy.kv_size if g.budget is None else g.budget, device="cpu").expand_as(q)  # (B,)
            bad = question.no_room(policy, k, g.load, q)  # (B,) the preflight asks the same of the prompts
            if bool(bad.any()):
                b = int(bad.nonzero()[0])
                raise ValueError("query_aware=false: " + question.refusal(int(q[b]), int(k[b]),
                                                                          int(question.protected(policy, k)[b])))
            keep = question.context_keep(policy, k, q)  # (B,)
            rows = g.load > k if policy.once else g.load + q > k
            if bool(rows.any()):
                cache.evict(rows, keep, policy, group=g)
            need = knobs.decode_capacity(policy, int(k.max()), max_new_tokens + int(q.max()), cache.heads)
            if g.capacity > need and int(g.n.max()) < need:
                cache.resize(need, group=g)  # the context is compressed: give its memory back
    if observer:
        observer("evict", cache)
