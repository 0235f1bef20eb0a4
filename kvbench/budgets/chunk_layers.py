"""The chunk layer rule (ChunkKV, Liu et al., 2025): a sample keeps whole chunks of `chunk_length` pairs, so its
budget is a number of chunks, the same in every layer.

A prompt of n pairs forms ceil(n / c) chunks from its first pair, the last one partial. kvpress 0.5.5's ChunkKVPress
keeps max(1, int(chunks x (1 - compression_ratio))) chunks; at kv_size or kv_ratio kvbench keeps the most chunks
whose pairs fit the budget, the newest (partial) one at its own length: 1 + (budget - newest) // c, at least 1, so
a budget of the whole prompt keeps it whole. The newest chunk is among them (kvbench.policies.chunkkv): the budget
is (kept - 1) x c + the newest chunk's length (every chunk: the prompt, or the budget when it is larger). A prompt
shorter than one chunk keeps the inner policy's own budget (kvpress: the inner press's compress). The cache, the
schedule, serve mode and the memory account read this count, so the memory freed is the chunks'.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from kvbench.budgets.rule import LayerRule


class ChunkLayers(LayerRule):
    name: ClassVar[str] = "chunks"
    label: ClassVar[str] = "ChunkKV"

    def budgets(self, policy, per_sample: torch.Tensor, layers: int, lengths: list[int]) -> torch.Tensor:
        row = [chunk_budget(policy, n, int(k)) for n, k in zip(lengths, per_sample.tolist(), strict=True)]
        return torch.tensor(row, dtype=torch.long, device="cpu")[None, :].expand(layers, -1).clone()

    def extensions(self, policy) -> list[str]:
        return [f"whole chunks of {policy.chunk_length} pairs kept: a sample's budget is its kept chunks' pairs, "
                "the newest chunk among them"]


def chunk_budget(policy, n: int, budget: int) -> int:
    """Pairs a prompt of n pairs keeps in whole chunks, from its budget in pairs (module docstring)."""
    c = policy.chunk_length
    if n < c:
        return budget
    chunks = -(-n // c)
    newest = n - (chunks - 1) * c  # the newest chunk's pairs (1 to c)
    if policy.compression_ratio is not None:
        kept = max(1, int(chunks * (1 - policy.compression_ratio)))
    else:  # the most chunks whose pairs fit the budget, the newest at its own length
        kept = 1 + max(0, budget - newest) // c
    if kept >= chunks:  # every chunk: nothing is evicted (a budget above the prompt stays what it was)
        return max(budget, n)
    return (kept - 1) * c + newest
