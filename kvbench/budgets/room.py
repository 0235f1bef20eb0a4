"""`Budgets`: the pairs each (layer, sample, KV head) of a batch may hold, one object the cache, the schedule
and the memory account read.

Built before prefill from the policy's knobs (`Budgets.of`: kv_size, a share of each prompt, the policy's layer
rule such as PyramidKV's), every head of a (layer, sample) holding the layer's budget. Under a head rule that
chooses the heads' counts from scores (`rule.needs_score`: AdaKV's `adaptive`) an eviction records the counts it
chose here (`set_heads`): the layer's total stays budget x heads, its heads' shares differ. Readers:

    layer      (L, B)     the per-head average a (layer, sample) may hold: the schedule evicts on it
    pairs      (L, B, H)  each head's share (equal to `layer` until `set_heads`)
    slots      (L, B)     the most pairs one head of it may hold (`head_slots`): what the cache preallocates
                          and the memory account charges
"""

from __future__ import annotations

import torch

from kvbench.budgets import knobs
from kvbench.budgets.rule import head_rule


class Budgets:
    """Pairs per (layer, sample, KV head) of one batch, on the CPU. `policy`: the knobs it was built from; `rule`:
    its head rule."""

    def __init__(self, policy, layer: torch.Tensor, heads: int):
        self.policy, self.heads, self.rule = policy, heads, head_rule(policy)
        self.layer = layer.to(torch.long).cpu()  # (L, B)
        self.pairs = self.layer[:, :, None].expand(-1, -1, heads).clone()  # (L, B, H)

    @classmethod
    def of(cls, policy, lengths: list[int], layers: int, heads: int,
           compressed: list[int] | None = None) -> Budgets | None:
        """The budgets of a batch of prompts with these (context) lengths; None for the full cache. `compressed`:
        the layers the policy compresses (None: all; `knobs.layer_budgets`)."""
        layer = knobs.layer_budgets(policy, lengths, layers, compressed)
        return None if layer is None else cls(policy, layer, heads)

    @property
    def slots(self) -> torch.Tensor:
        """(L, B) the most pairs one head of a (layer, sample) may hold, before any eviction chose the counts."""
        return self.rule.slots(self.policy, self.layer, self.heads)

    def keep(self, budget):
        """Pairs per head (on average) an eviction under `budget` leaves (`knobs.keep`)."""
        return knobs.keep(self.policy, budget)

    def set_heads(self, layers: list[int], rows: torch.Tensor, counts: torch.Tensor) -> None:
        """Record the per-head counts (L_g, B', H) an adaptive eviction chose for `layers` and the rows (B,) bool."""
        counts = counts.to(device="cpu", dtype=torch.long)
        idx = torch.tensor(layers, dtype=torch.long, device="cpu")
        sub = self.pairs[idx]  # (L_g, B, H) a copy
        sub[:, rows] = counts
        self.pairs[idx] = sub

    def capacities(self, lengths: list[int], max_new_tokens: int) -> list[int]:
        """Slots to preallocate per layer (`knobs.capacities`)."""
        return knobs.capacities(self.policy, lengths, max_new_tokens, self.layer, self.heads)

    def decode_capacity(self, budget: int, max_new_tokens: int) -> int:
        """Slots a layer needs once its prompt is compressed to `budget` (`knobs.decode_capacity`)."""
        return knobs.decode_capacity(self.policy, budget, max_new_tokens, self.heads)

    def recent(self, budget: torch.Tensor) -> torch.Tensor:
        """(B,) newest pairs protected under these budgets (`knobs.recent_pairs`)."""
        return knobs.recent_pairs(self.policy, budget)

    def __getitem__(self, layers) -> Budgets:
        """The budgets of some layers (e.g. the full-attention ones: a bool list or index)."""
        out = Budgets.__new__(Budgets)
        out.policy, out.heads, out.rule = self.policy, self.heads, self.rule
        sel = torch.as_tensor(layers) if isinstance(layers, list) else layers
        out.layer, out.pairs = self.layer[sel], self.pairs[sel]
        return out
