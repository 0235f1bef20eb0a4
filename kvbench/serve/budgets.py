"""Each request's budget per (layer, KV head), from its own prompt: what the scheduler holds it to.

`RequestBudgets(policy, shape)` gives a request, at admission, `budget` (L, H) and `recent` (L, H), from
kvbench.budgets (the same arithmetic as the static engine's):
- kv_size: the same count everywhere (one budget per request);
- kv_ratio / compression_ratio: the request's own prompt sets it (at least the policy's minimum);
- a layer rule whose layers differ (PyramidKV's pyramid): each layer its own count, from the request's prompt;
- per-(layer, KV head) counts given directly (`heads`: a function of the request, e.g. a hand-made
  uneven split, or a head rule's fixed ones, `HeadRule.head_budgets`: DuoAttention's pattern); each head then owns
  its own pages and frees them head by head;
- a head rule that chooses the counts by score (`needs_score`: AdaKV's `adaptive`): the layer's budget in every
  head until the request's prefill ends, then the layer's pairs split across its KV heads by the rule (applied by
  the model runner's `reallocate` at the one compression of schedule=after_prefill).
`recent` is the policy's `recent_pairs` of each budget (H2O: half of it). `per_head` says whether budgets
may differ across layers or KV heads (the eviction's `head` scope, kvbench.serve.blocks_evict).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvbench import budgets

HeadBudgets = Callable[[object], torch.Tensor]  # request -> (L, H) pairs each (layer, KV head) may hold


class RequestBudgets:
    def __init__(self, policy, shape: tuple[int, int], heads: HeadBudgets | None = None):
        self.policy, self.shape, self.heads = policy, shape, heads
        self.adaptive = policy.evicts and heads is None and budgets.head_rule(policy).needs_score  # chosen by score
        self.per_layer = policy.evicts and budgets.layer_rule(policy).varies
        self.per_head = policy.evicts and (heads is not None or self.per_layer or policy.once or self.adaptive)

    def __call__(self, req) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(budget, recent), each (L, H) long, or (None, None) when the policy never evicts."""
        if not self.policy.evicts:
            return None, None
        L, H = self.shape
        if self.heads is not None:
            b = torch.as_tensor(self.heads(req), dtype=torch.long)
            budget = b.expand(torch.broadcast_shapes(b.shape, (L, H))).clone()  # (L, H): the heads' own shape
        else:
            budget = budgets.layer_budgets(self.policy, [len(req.prompt)], L)[:, 0, None].expand(L, H).clone()  # (L, H)
        return budget, budgets.recent_pairs(self.policy, budget)
