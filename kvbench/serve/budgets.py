"""Each request's budget per (layer, KV head), from its own prompt: what the scheduler holds it to.

`RequestBudgets(policy, shape)` gives a request, at admission, `budget` (L, H) and `recent` (L, H):
- kv_size: the same count everywhere (one budget per request);
- kv_ratio / compression_ratio: the request's own prompt sets it (`policy.budgets([prompt length])`,
  at least the policy's minimum);
- per-layer budgets (PyramidKV): each layer its own count, from the request's prompt;
- per-(layer, KV head) counts given directly (`heads`: a function of the request, e.g. a hand-made
  uneven split); each head then owns its own pages and frees them head by head;
- `policy.head_budget=adaptive` (AdaKV): the layer's budget in every head until the request's prefill
  ends, then the layer's pairs split across its KV heads by score (kvbench.budgets.adakv's rule, applied by
  the model runner's `reallocate` at the one compression of schedule=after_prefill).
`recent` is the policy's `recent_pairs` of each budget (H2O: half of it). `per_head` says whether budgets
may differ across layers or KV heads (the eviction's `head` scope, kvbench.serve.evict).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvbench.policies.base import Policy

HeadBudgets = Callable[[object], torch.Tensor]  # request -> (L, H) pairs each (layer, KV head) may hold


def adaptive(policy: Policy) -> bool:
    """Whether the policy splits each layer's budget across its KV heads by score (AdaKV)."""
    return getattr(policy, "head_budget", "uniform") == "adaptive" and policy.evicts


def per_layer(policy: Policy) -> bool:
    """Whether the policy gives layers different budgets (it overrides `layer_budgets`)."""
    return type(policy).layer_budgets is not Policy.layer_budgets


class RequestBudgets:
    def __init__(self, policy: Policy, shape: tuple[int, int], heads: HeadBudgets | None = None):
        self.policy, self.shape, self.heads = policy, shape, heads
        self.adaptive = adaptive(policy)
        self.per_head = policy.evicts and (heads is not None or per_layer(policy) or policy.once or self.adaptive)

    def __call__(self, req) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(budget, recent), each (L, H) long, or (None, None) when the policy never evicts."""
        if not self.policy.evicts:
            return None, None
        L, H = self.shape
        if self.heads is not None:
            budget = torch.as_tensor(self.heads(req), dtype=torch.long).expand(L, H).clone()
        else:
            budget = self.policy.budgets([len(req.prompt)], L)[:, 0, None].expand(L, H).clone()  # (L, H)
        return budget, self.policy.recent_pairs(budget)
