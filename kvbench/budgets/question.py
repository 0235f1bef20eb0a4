"""Query-agnostic runs (`task.query_aware=false`, kvpress's protocol): the room a compressed context leaves its
question. One rule, read by the engine after loading and by the preflight before anything loads.

Before the question's q_b tokens are prefilled, a sample whose layer holds n_b context pairs under a budget k_b
evicts when n_b + q_b > k_b, down to min(k_b - p, k_b - q_b) pairs (`context_keep`; after_prefill: to k_b, the
question then kept like generated tokens). An eviction keeps the protected pairs (`protect_first` sinks and the
newest `knobs.recent_pairs`) and one more, so a question of q_b >= k_b - protected tokens leaves no room
(`no_room`). The engine (kvbench.engine.evictions.compress_context) asks it of the pairs it holds; the preflight
(kvbench.config.preflight.check_question_room) of each prompt's context length, per full-attention layer (the
ones a policy compresses; windowed layers keep their window and need no room): when `no_room` holds, a context
evicted during prefill still holds at least k_b - p > k_b - q_b pairs, so both ask the same question.
"""

from __future__ import annotations

import torch

from kvbench.budgets.knobs import keep as knobs_keep
from kvbench.budgets.knobs import recent_pairs
from kvbench.budgets.rule import head_rule


def context_keep(policy, budget: torch.Tensor, question: torch.Tensor) -> torch.Tensor:
    """Context pairs an eviction before the question keeps, per row (budget and question broadcast, e.g. (B,)):
    the budget under after_prefill, else min(k - p, k - q); k - p under a rule whose counts are the data's (DMS's
    threshold: its window, the question then arriving whole, its pairs decided as they leave the window)."""
    if policy.once or head_rule(policy).data_dependent:
        return knobs_keep(policy, budget).expand(torch.broadcast_shapes(budget.shape, question.shape))
    return torch.minimum(budget - policy.evict_every, budget - question)


def protected(policy, budget: torch.Tensor) -> torch.Tensor:
    """Pairs an eviction under `budget` must keep: the sinks and the newest protected ones (same shape)."""
    return policy.protect_first + recent_pairs(policy, budget)


def no_room(policy, budget: torch.Tensor, held: torch.Tensor, question: torch.Tensor) -> torch.Tensor:
    """Bool, per row (broadcast shapes): the row must evict before its question (held + q > budget) and what
    the eviction would keep is below its protected pairs + 1. Never under after_prefill (one compression to the
    budget, the question kept beside it), nor under a rule whose counts are the data's (no budget to make room in)."""
    if policy.once or head_rule(policy).data_dependent:
        return torch.zeros(torch.broadcast_shapes(budget.shape, held.shape, question.shape), dtype=torch.bool)
    return (held + question > budget) & (context_keep(policy, budget, question) < protected(policy, budget) + 1)


def refusal(question: int, budget: int, guard: int) -> str:
    """Why, in one line (the engine's error and the preflight's refusal alike)."""
    return (f"a question of {question} tokens leaves no room in a budget of {budget} pairs (an "
            f"eviction before it keeps min(budget - evict_every, budget - question) context pairs, and must keep "
            f"{guard} protected + 1): raise the budget, or use task.query_aware=true or policy.schedule=after_prefill")
