"""Which tokens each forward pass processes, and when a sample evicts (Algorithm 1 of method.md).

Per sample, its own prompt is split like Algorithm 1 at batch size 1: a first block of
min(s_b, kv_size) positions (processed in chunks of `chunk`, no eviction inside), then blocks of
p = evict_every positions, each preceded by an eviction of p pairs. Without prefill eviction the
whole prompt is the first block. The per-sample block lists are right-aligned so that every sample
processes its last prompt token in the same (final) forward; a forward's width is the largest block
of that step and each sample's tokens are right-aligned in it (left padding inside the chunk).

Budgets: k_b = kv_size by default; per sample with `policy.kv_ratio`, and per layer for PyramidKV
(then the first block is the smallest budget of the sample's layers, and a layer with a larger budget
keeps filling block by block until it reaches it). Below, "kv_size" reads "the budget k".

after_prefill (kvpress's protocol): no eviction in prefill; at the first decode step every sample whose
prompt holds more than its budget k_b is compressed to exactly k_b pairs, then nothing is evicted again.

Eviction rule, the same in prefill and decode: before a forward that brings r_b real tokens,
sample b evicts down to kv_size - p pairs if n_b + r_b > kv_size (per layer when layers differ). This is Algorithm 1 for
prefill_and_decode (an eviction always finds the cache at exactly kv_size there, so "down to
kv_size - p" is "evict p pairs"). For decode_only a sample whose prompt has s_b >= kv_size pairs
compresses them at once, down to kv_size - p, at its first decode step, and from then on follows
Algorithm 1's decode loop (evict p when the cache holds kv_size); a shorter prompt just fills up
to kv_size first. With p = 1 (H2O, TOVA) the cache then holds exactly kv_size pairs after every
decode forward; with p > 1 it cycles between kv_size - p + 1 and kv_size. method.md does not spell
decode_only out for p > 1; this is Algorithm 2 (extreme_decode, where kv_size - p = 1) generalised.
"""

from __future__ import annotations

import torch

from kvbench.budgets import knobs
from kvbench.policies.policy import Policy


def block_sizes(length: int, first_block: int | None, block: int, chunk: int) -> list[int]:
    """Algorithm 1's blocks for one prompt of `length` tokens (first block split into chunks)."""
    first = length if first_block is None else min(length, first_block)
    sizes = [min(chunk, first - a) for a in range(0, first, chunk)]
    sizes += [min(block, length - a) for a in range(first, length, block)]
    return sizes


def prefill_chunks(lengths: list[int], policy: Policy, chunk: int | None,
                   budgets: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Real tokens per sample for each prefill forward: a list of (B,) long tensors.

    `budgets`: the (L, B) layer budgets of the batch (kvbench.budgets.Budgets.layer), computed here when not given.
    """
    longest = max(lengths)
    if policy.evicts_in_prefill:
        chunk = chunk or policy.evict_every
        if budgets is None:
            budgets = knobs.layer_budgets(policy, lengths, 1)
        first = budgets.min(dim=0).values.tolist()  # (B,) the smallest layer budget of each sample
        per_sample = [block_sizes(s, f, policy.evict_every, chunk) for s, f in zip(lengths, first, strict=True)]
    else:
        chunk = chunk or longest
        per_sample = [block_sizes(s, None, chunk, chunk) for s in lengths]
    steps = max(len(x) for x in per_sample)
    table = torch.tensor([[0] * (steps - len(x)) + x for x in per_sample], dtype=torch.long, device="cpu")  # (B, K)
    return list(table.T.unbind(0))




def rows_to_evict(n: torch.Tensor, r: torch.Tensor, policy: Policy, prefill: bool,
                  budget: torch.Tensor | None = None, first_decode: bool = False) -> torch.Tensor | None:
    """(B,) bool of samples that must evict before a forward bringing r tokens, or None.

    n: (B,) pairs held per head (by a group of layers that share budgets; on average over the heads under adaptive
    head budgets); budget: their (B,) budgets (default kv_size);
    first_decode: this is the first decode step (after_prefill compresses then, and only then).
    """
    if not policy.evicts or (prefill and not policy.evicts_in_prefill):
        return None
    k = policy.kv_size if budget is None else budget
    if policy.once:  # after_prefill: the prompt is compressed once, to its budget
        rows = (n > k) if first_decode else torch.zeros_like(n, dtype=torch.bool)
    else:
        rows = (n + r > k) & (r > 0)
    return rows if bool(rows.any()) else None
