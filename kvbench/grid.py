"""Prefill chunks on one grid for every sample: what a hybrid model's linear-attention layers need to be exact.

A Gated-DeltaNet layer (kvbench.models.family.hybrid) sees a pad token as a zero input (the model multiplies its
hidden states by the 2-D padding mask): harmless before a sample's first real token (its state is still zero), but a
pad between two real tokens shifts the conv window and decays the recurrent state. kvbench's schedule gives each
sample its own block plan, right-aligned per forward (kvbench.schedule), so a sample's real tokens would follow pads
inside a later chunk. Here the prompts are laid out as if left-padded to the longest (what transformers' `generate`
does), each sample's own blocks (Algorithm 1 on its prompt) are placed on that common axis, and every forward runs
from one block boundary of any sample to the next: a sample's real tokens then fill the whole forward, or it has
not started yet (pads only before its first real token). A sample's block is split over several forwards only where
another sample's boundary falls inside it; the eviction rule (before a forward that would exceed the budget) then
evicts at the same points as its own plan, so a sample's pairs, and its tokens, do not depend on its batch.
"""

from __future__ import annotations

import torch

from kvbench.policies.policy import Policy
from kvbench.schedule import prefill_chunks


def grid_chunks(lengths: list[int], policy: Policy, chunk: int | None,
                budgets: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Real tokens per sample for each prefill forward (a list of (B,) long tensors) on the common grid.

    `budgets`: the (L, B) layer budgets of the batch (those of the layers a policy compresses)."""
    S = max(lengths)
    own = torch.stack(prefill_chunks(lengths, policy, chunk, budgets), dim=1)  # (B, K) each sample's blocks
    cuts = {0, S}
    for s, blocks in zip(lengths, own.tolist(), strict=True):  # sample b's boundaries on the common axis
        a = S - s
        for w in filter(None, blocks):  # (its plan is right-aligned: zeros before its first block)
            a += w
            cuts.add(a)
    edges = sorted(cuts)
    starts = torch.tensor([S - s for s in lengths], dtype=torch.long, device="cpu")  # (B,) first real grid position
    out = []
    for a, z in zip(edges, edges[1:], strict=False):  # sample b's real tokens in [a, z): all of them once it started
        out.append((z - torch.maximum(starts, torch.tensor(a))).clamp(0, z - a))
    return [r for r in out if int(r.max()) > 0]
