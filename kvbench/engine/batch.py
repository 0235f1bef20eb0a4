"""One batch's state: right-padded prompts, its budgets (kvbench.budgets.Budgets), its prefill chunks, the
evicting cache sized for them and the plan of its forwards (kvbench.batch_plan)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from kvbench.attention.interface import attention_modules
from kvbench.batch_plan import BatchPlan, Room, prefill_chunks_of
from kvbench.budgets import Budgets, head_rule
from kvbench.cache import KVCache, layer_capacities
from kvbench.cache.sink import Observing
from kvbench.errors import ConfigError
from kvbench.models import family
from kvbench.models.geometry import rope_inv_freq
from kvbench.policies.policy import Policy


def observer_kwargs(model, policy: Policy) -> dict:
    """A policy's observe step (kvbench.policies.needs): the policy, each layer's attention module, the rotary embedding."""
    if not policy.needs.observes:
        return {}
    return {"observer": Observing(policy, attention_modules(model), getattr(model.get_decoder(), "rotary_emb", None))}


def head_means(policy: Policy, config, lengths: list[int], question: torch.Tensor, new: int) -> torch.Tensor | None:
    """(L, B) float: per (layer, sample) the mean over its KV heads of what each head may hold, where the head rule
    fixes each head's budget from the model (DuoAttention's pattern: a retrieval head the whole sequence, a streaming
    head its window), as serve mode records a request's; None where every head holds the layer's budget (or the
    counts come from scores). What the record's kv_budget reports (kvbench.engine.output)."""
    rule = head_rule(policy)
    budget = rule.head_budgets(policy, config) if rule.fixed and policy.evicts else None
    if budget is None:
        return None
    rows = [budget(SimpleNamespace(prompt=range(n), max_new_tokens=new + q)).float().mean(1)  # (L,) each
            for n, q in zip(lengths, question.tolist(), strict=True)]
    return torch.stack(rows, dim=1)


class Batch:
    """One batch's tensors: right-padded prompts (B, S) on the CPU, the budgets, the chunks, the cache.

    `question`: per prompt, its last tokens that are the question (query-agnostic: the budgets come from the
    context, the prompt less its question, and the question is kept like generated tokens).
    """

    def __init__(self, model, ids: list[list[int]], policy: Policy, max_new_tokens: int, pad_id: int, geometry,
                 prefill_chunk: int | None = None, question: list[int] | None = None):
        self.question = torch.tensor(question or [0] * len(ids), dtype=torch.long, device="cpu")  # (B,) question
        self.lengths = [len(x) - q for x, q in zip(ids, self.question.tolist(), strict=True)]  # the context's
        q_max, new = int(self.question.max()), max_new_tokens
        max_new_tokens += q_max  # the question is kept like generated tokens
        B, s = len(ids), max(len(x) for x in ids)
        self.prompts = torch.full((B, s), pad_id, dtype=torch.long, device="cpu")  # (B, S)
        for b, x in enumerate(ids):
            self.prompts[b, : len(x)] = torch.tensor(x, dtype=torch.long, device="cpu")
        # a window never cut: full; a budget below a window compresses that layer too (its window bounds it)
        windows, bands = family.split_windows(geometry["windows"], s + max_new_tokens,
                                              policy.kv_size if policy.evicts else None)
        heads = geometry["num_kv_heads"]  # per layer where layers differ (Gemma 4): budgets (L, B, H) pad to the most
        heads = max(heads) if isinstance(heads, list) else heads
        # what the policy compresses: the full-attention layers (windowed ones keep their window)
        full = [w is None and i not in geometry.get("linear", ()) for i, w in enumerate(windows)]
        compressed = [i for i, f in enumerate(full) if f]
        self.room = Budgets.of(policy, self.lengths, len(windows), heads, compressed)  # (L, B, H) or None: full cache
        self.budgets = None if self.room is None else self.room.layer  # (L, B)
        self.full_budgets = None if self.budgets is None or not any(full) else self.budgets[full]  # (L_full, B)
        held = head_means(policy, model.config, self.lengths, self.question, new)  # (L, B) or None
        self.held_budgets = self.full_budgets if held is None or self.full_budgets is None else held[full]
        # (a context of 0 tokens: kvbench.continuation's one-token contexts, all in the question's forward)
        linear = geometry.get("linear") or []  # a hybrid's linear layers: one grid (kvbench.grid)
        self.chunks = prefill_chunks_of(self.lengths, policy, prefill_chunk, self.full_budgets, bool(linear))
        if linear and len(set(self.question.tolist())) > 1:
            raise ConfigError("policy.query_aware", "false needs one question length per batch on a hybrid model "
                              "(a pad between two real tokens would reach its linear-attention state)", False)
        family.check_length_rope(model.config, s, s, new, len(self.chunks) > 1 or q_max > 0)  # the padded batch
        widest = max([int(r.max()) for r in self.chunks] + [q_max])  # the question is one forward of its own
        caps = [max(self.lengths) + max_new_tokens] if self.room is None else self.room.capacities(self.lengths,
                                                                                                  max_new_tokens)
        self.cache = KVCache(
            batch_size=B,
            capacity=layer_capacities(caps, windows, self.lengths, max_new_tokens, widest),
            budgets=self.room,
            track_attention=policy.needs.attention,
            query_window=policy.needs.queries,
            rope_inv_freq=rope_inv_freq(model) if policy.rerotate and policy.evicts else None,
            **{**geometry, "windows": windows},  # a window never cut: full attention, as budgeted
            bands=bands, **observer_kwargs(model, policy),
        )
        self.pad_id = pad_id
        # every forward and the evictions, trims and resizes before it (kvbench.batch_plan), on the cache's groups
        self.plan = BatchPlan(policy, [Room(g.capacity, g.budget, g.sliding) for g in self.cache.groups], self.chunks,
                              new, self.question, heads, B)

    def chunk_ids(self, r: torch.Tensor, width: int) -> torch.Tensor:
        """(B, width) ids: sample b's next r_b prompt tokens right-aligned, pads to the left."""
        start = self.cache.seen  # tokens already processed
        i = torch.arange(width, device="cpu")[None, :]
        src = start[:, None] + i - (width - r)[:, None]
        real = src >= start[:, None]
        ids = self.prompts.gather(1, src.clamp(0, self.prompts.shape[1] - 1))
        return torch.where(real, ids, torch.full_like(ids, self.pad_id))
