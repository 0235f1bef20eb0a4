"""The global head rule (`head_budget=global`): one ranking over a sample's whole (layer, KV head, pair) table, as
KVzip's default (kvpress 0.5.5 `KVzipPress.compress_post`, `layerwise=False`): layers and heads compete, so the
counts vary by layer and by head.

For one sample holding n pairs in each of the L x H (layer, head) rows of the ranked table, the kept total is
L H n - int(L H n x compression_ratio) (kvpress's `n_pruned`) under `compression_ratio`, else L H x the budget;
the best that many over the flattened table are kept, and each head then keeps its own best c_{l,h} (the cache's
`select`). Ties rank as a stable ascending sort over the table flattened layer-major (the lower layer, head and
slot goes first), a fixed choice where kvpress's topk leaves it unspecified. Pure: scores in, counts out.

What the engine needs: a score (`needs_score`), one choice when the prompt is compressed (`once_only`), heads
holding different counts (`uneven`), and each head at most every pair its sample holds (`slots`: the whole
prompt, the cache's capacity is capped at that, kvbench.budgets.knobs.capacities). The ranking spans the layers
of one group of the cache (every full-attention layer unless a device split or layer budgets part them).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from kvbench.budgets.rule import HeadRule
from kvbench.errors import ConfigError

TRANSIENT_BYTES = 4 + 8 + 8 + 8  # the float copy, the flattened sort (indices), the chosen ranks, the counts


def kept_total(policy, valid: torch.Tensor, keep: torch.Tensor, rows: int) -> torch.Tensor:
    """(B,) pairs a sample keeps over a table of `valid` (B,) held pairs: kvpress's count under compression_ratio,
    else `rows` (layer, head) rows x its per-head budget `keep` (B,)."""
    if policy.compression_ratio is not None:
        return valid - (valid.double() * policy.compression_ratio).floor().long()
    return rows * keep.long()


def table_counts(ranked: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """(L, B, H) counts when each sample b keeps the total_b best of its (L, H, N) table `ranked` (L, B, H, N)."""
    L, B, H, N = ranked.shape
    flat = ranked.float().permute(1, 0, 2, 3).reshape(B, L * H * N)  # (B, L H N) layer-major
    order = torch.sort(flat, dim=-1, stable=True).indices  # ascending: the best last
    chosen = torch.arange(L * H * N, device=flat.device)[None] >= L * H * N - total.to(flat.device)[:, None]
    counts = torch.zeros(B, L * H, dtype=torch.long, device=flat.device)
    counts.scatter_add_(-1, order // N, chosen.long())
    return counts.view(B, L, H).permute(1, 0, 2).contiguous()


class GlobalHeads(HeadRule):
    name: ClassVar[str] = "global"
    needs_score: ClassVar[bool] = True
    once_only: ClassVar[bool] = True
    uneven: ClassVar[bool] = True
    transient: ClassVar[int] = 8 + TRANSIENT_BYTES

    def validate(self, policy) -> None:
        hb = policy.head_budget
        if policy.keeps_newest:
            raise ConfigError("policy.head_budget", f"{policy.name} keeps the newest pairs by position: {self.name} "
                              "head budgets need a score", hb)
        if not policy.once:
            raise ConfigError("policy.head_budget", f"{self.name} head budgets are chosen once, when the prompt is "
                              "compressed after prefill: use policy.schedule=after_prefill", hb)
        if policy.rerotate:
            raise ConfigError("policy.head_budget", f"{self.name} head budgets give heads different counts; "
                              "policy.rerotate needs one count (rotary positions are shared)", hb)

    def slots(self, policy, pairs, heads: int | None):
        """Every pair the sample holds may stay in one head: unbounded here, the prompt's length in the cache."""
        big = 1 << 40
        return torch.full_like(pairs, big) if isinstance(pairs, torch.Tensor) else big

    def counts(self, policy, ranked: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        L, _, H, _ = ranked.shape
        valid = (ranked > -float("inf")).sum(dim=(0, 2, 3))  # (B,) pairs held over the table
        return table_counts(ranked, kept_total(policy, valid, keep.to(ranked.device), L * H))

    def extensions(self, policy) -> list[str]:
        return [f"head_budget={self.name}: one ranking over each sample's whole (layer, KV head, pair) table (KVzip's "
                "default), per-head counts vary; the cache holds each head's pairs packed"]
