"""Per-head counts in a group of layers under adaptive head budgets (`policy.head_budget=adaptive`, AdaKV).

An eviction chooses how many pairs each (layer, sample, KV head) keeps (the policy's head rule, kvbench.budgets.rule: AdaKV's in kvbench/budgets/adaptive_heads.py) and each head
keeps its best ones, packed at the front of its slots in position order. Slots stay aligned across heads (a
forward writes every head's new pair at the same slot), so a sample's count n_b becomes its largest head's
and a head holding c < n_b pairs has a hole at slots [c, n_b) until the next eviction (`gap_end` = n_b right
after it; every later write lands past it). Per group:

    head_n   (L_g, B, H)  pairs each head kept at the last eviction (on the group's device)
    gap_end  (B,)         the sample's count right after it (on the group's device)

`kept_pairs` counts what the heads really hold (a record's `kv_kept_share`, any head rule).
Attention then masks each head's hole (`layer_step`: a (B, H_kv, T, N) mask per layer); the cache's memory is
the largest head's (`kvbench.budgets.head_slots` bounds it before the run, the memory account charges
that bound).
"""

from __future__ import annotations

import dataclasses

import torch

from kvbench.budgets import head_rule


def counts(ranked: torch.Tensor, keep: torch.Tensor, policy) -> tuple[torch.Tensor, torch.Tensor]:
    """The head rule's counts (L, B', H) for scores `ranked` as `select` ranks them; (on the device, on the CPU)."""
    c = head_rule(policy).counts(policy, ranked, keep)
    return c, c.cpu()  # the one device sync of an adaptive eviction: the slots a sample holds now


def record(g, rows: torch.Tensor, sel, c: torch.Tensor, host: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Store the counts `c` (L_g, B', H) of the rows (B,) bool (`sel` indexes them on the device), which keep
    `keep` (B,) pairs per head on average; returns the samples' new counts (B,) on the CPU: their largest head's."""
    most = host.amax(dim=(0, 2))  # (B',) the largest head of each evicted sample
    n = g.n.clone()
    n[rows] = most
    g.excess = torch.where(rows, n - keep, g.excess)  # the average stays the budget's: `Group.load`
    if g.head_n is None:  # no hole yet: every head holds the sample's count
        g.head_n = g.n.to(g.device)[None, :, None].expand(len(g.layers), -1, c.shape[-1]).clone()
    g.head_n[:, sel] = c
    end = n.to(g.device)  # the rows that did not evict keep their hole (a later eviction: different rows evict)
    g.gap_end = end if g.gap_end is None else torch.where(rows.to(g.device), end, g.gap_end)
    return n


def kept_pairs(groups, seen: torch.Tensor) -> tuple[int, int]:
    """(pairs the full-attention `groups` hold now, pairs the `seen` (B,) tokens brought them), summed over layers, KV
    heads and samples: each head's own count where heads differ (a hole is not held)."""
    held = brought = 0
    for g in [g for g in groups if g.sliding is None]:
        H = g.pos.shape[2]  # (L, B, H_kv, S): a quantized group holds no k
        brought += len(g.layers) * H * int(seen.sum())
        if g.head_n is None:
            held += len(g.layers) * H * int(g.n.sum())
        else:  # each head's count at the last eviction, then every pair written past its hole
            held += int(g.head_n.sum()) + len(g.layers) * H * int((g.n - g.gap_end.cpu()).sum())
    return held, brought


def mask_holes(ranked: torch.Tensor, g, sel) -> torch.Tensor:
    """`ranked` (L_g, B', H, N) of the rows `sel` with each head's hole [head_n, gap_end) at -inf: a second eviction
    (DuoAttention's streaming heads under prefill_and_decode / decode_only) ranks only what each head holds."""
    slot = torch.arange(ranked.shape[-1], device=ranked.device)
    hole = (slot >= g.head_n[:, sel][..., None]) & (slot < g.gap_end[sel][None, :, None, None])
    return ranked.masked_fill(hole, -float("inf"))


def layer_step(step, g, i: int):
    """The Step of layer i of an adaptive group `g`: the group's, with each head's hole masked (real queries
    only: a pad row keeps slot 0, and a real query always sees its own token, written past every hole)."""
    N = step.n_keys
    slot = torch.arange(N, device=g.device)
    hole = (slot >= g.head_n[i][:, :, None]) & (slot < g.gap_end[:, None, None])  # (B, H, N)
    hole = hole[:, :, None, :] & step.real[:, None, :, None]  # (B, H, T, N)
    if step.mask is None:  # causal or one uniform decode token: every held slot was visible
        causal = None if not step.causal else slot[None, :] <= torch.arange(step.real.shape[1], device=g.device)[:, None]
        mask = ~hole if causal is None else causal[None, None] & ~hole
    else:
        mask = step.mask & ~hole
    return dataclasses.replace(step, mask=mask, causal=False)


def holes_as(x: torch.Tensor, g, i: int, b: int, fill) -> torch.Tensor:
    """Sample b's per-slot (H, n) tensor `x` of layer i with its heads' holes set to `fill`."""
    slot = torch.arange(x.shape[-1], device=x.device)
    hole = (slot >= g.head_n[i, b][:, None]) & (slot < g.gap_end[b])
    return x.masked_fill(hole, fill)
