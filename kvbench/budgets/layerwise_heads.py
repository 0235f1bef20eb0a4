"""The layerwise head rule (`head_budget=layerwise`): one ranking per (layer, sample) over its KV heads' pairs, as
KVzip's `layerwise=True` (kvpress 0.5.5): each layer keeps H n - int(H n x compression_ratio) pairs under
`compression_ratio` (else H x the budget), its heads competing, so per-head counts vary within a layer. Ties as
`global_heads` (the lower head and slot goes first). AdaKV's `adaptive` with no floor, save kvpress's count.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from kvbench.budgets.global_heads import GlobalHeads, kept_total, table_counts


class LayerwiseHeads(GlobalHeads):
    name: ClassVar[str] = "layerwise"

    def counts(self, policy, ranked: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        L, B, H, N = ranked.shape
        valid = (ranked > -float("inf")).sum(dim=(2, 3))  # (L, B) pairs held per layer
        total = kept_total(policy, valid.reshape(-1), keep.to(ranked.device).repeat(L), H)  # (L B,)
        return table_counts(ranked.reshape(1, L * B, H, N), total)[0].view(L, B, H)

    def extensions(self, policy) -> list[str]:
        return [f"head_budget={self.name}: one ranking per layer over its KV heads' pairs (KVzip's layerwise), "
                "per-head counts vary; the cache holds each head's pairs packed"]
