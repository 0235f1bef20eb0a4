"""Prefill chunks on one grid for every sample: what a hybrid model's linear-attention layers need to be exact.

A Gated-DeltaNet layer (kvbench.models.family.hybrid) sees a pad token as a zero input (the model multiplies its
hidden states by the 2-D padding mask): harmless before a sample's first real token (its state is still zero), but a
pad between two real tokens shifts the conv window and decays the recurrent state. kvbench's schedule gives each
sample its own block plan, right-aligned per forward (kvbench.schedule): a sample's real tokens then follow pads
inside a later chunk. Here every sample follows the block plan of the longest prompt, as if left-padded to it (what
transformers' `generate` does with a left-padded batch): sample b's real tokens in a block are its part of the
block, the block's last positions, and its pads are only ever before its first real token. The eviction rule is
unchanged (before a forward that would exceed the budget); with a per-sample budget the grid's first block is the
smallest budget, so a sample with a larger one fills up block by block (recorded in the run's extensions).
"""

from __future__ import annotations

import torch

from kvbench.budgets import knobs
from kvbench.policies.base import Policy
from kvbench.schedule import block_sizes


def grid_chunks(lengths: list[int], policy: Policy, chunk: int | None,
                budgets: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Real tokens per sample for each prefill forward (a list of (B,) long tensors) on the longest prompt's grid.

    `budgets`: the (L, B) layer budgets of the batch (those of the layers a policy compresses)."""
    S = max(lengths)
    if policy.evicts_in_prefill:
        if budgets is None:
            budgets = knobs.layer_budgets(policy, lengths, 1)
        blocks = block_sizes(S, int(budgets.min()), policy.evict_every, chunk or policy.evict_every)
    else:
        blocks = block_sizes(S, None, chunk or S, chunk or S)
    starts = torch.tensor([S - s for s in lengths], dtype=torch.long, device="cpu")  # (B,) first real grid position
    out, a = [], 0
    for w in blocks:  # sample b's real tokens in [a, a + w): the part at or after its first real position
        out.append((a + w - torch.maximum(starts, torch.tensor(a))).clamp(0, w))
        a += w
    return [r for r in out if int(r.max()) > 0]
