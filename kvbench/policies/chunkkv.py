"""ChunkKV (Liu et al., 2025): keep whole chunks of `chunk_length` consecutive pairs, ranked by any registered
policy's score (`inner`, SnapKV by default: kvpress's leaderboard row `ChunkKVPress(SnapKVPress(),
chunk_length=20)`), so that kept text stays contiguous.

From the first pair the prompt forms chunks of `chunk_length` (the last one partial). The inner score of every
pair is summed over the KV heads (every head keeps the same chunks), a chunk's score is its pairs' mean, and the
best chunks are kept whole: the sample's budget is a number of chunks (kvbench/budgets/chunk_layers.py, the
count the cache and the memory account use). The pairs the inner policy protects (SnapKV's observation window)
score the layer's largest inner score + 1, as kvpress's SnapKVPress gives its window (so a chunk holding some of
the window outranks the chunks without). A prompt shorter than one chunk
is the inner policy's own (kvpress: the inner press's compress). The inner policy's knobs are its defaults or
`inner_args` (`+policy.inner_args.window=32`), and read through this one (`policy.window` is SnapKV's).

Departures (in `extensions`): the newest chunk is always kept (kvpress: when it ranks; with SnapKV it holds the
window's maximal scores and ranks first); each sample chooses its own chunks (kvpress applies the first
sample's choice to the whole batch). Defined once, on the whole prompt (schedule=after_prefill, kvpress's
protocol); the other schedules are refused.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.budgets import is_int
from kvbench.errors import ConfigError
from kvbench.policies.inner_score import Wrapper, raised_score
from kvbench.policies.policy import AFTER_PREFILL, ScoreContext


@dataclass
class ChunkKV(Wrapper):
    chunk_length: int = 20
    name: ClassVar[str] = "chunkkv"
    no_loglikelihood: ClassVar[str | None] = "its whole-chunk budget is not applied by the log-likelihood path's compression yet"
    label: ClassVar[str] = "ChunkKV"
    summary: ClassVar[str] = "whole chunks of `chunk_length` pairs, by the mean of the inner policy's score"
    paper: ClassVar[tuple[str, str]] = ("Liu et al., 2025", "https://arxiv.org/abs/2502.00299")
    published_schedule: ClassVar[str] = AFTER_PREFILL  # kvpress's ChunkKVPress: the prompt compressed once
    gqa_note: ClassVar[str] = "GQA models: the inner score aggregates a KV group's query heads its own way"
    layer_budget: ClassVar[str] = "chunks"  # kvbench/budgets/chunk_layers.py
    not_inner: ClassVar[tuple[str, ...]] = ("chunkkv", "full", "extreme_decode")  # itself, no score, no after_prefill
    after_prefill_only: ClassVar[str | None] = "keeps whole chunks of the whole prompt, chosen once"
    uniform_heads_only: ClassVar[str | None] = "keeps the same chunks in every KV head"

    def validate(self) -> None:
        if not is_int(self.chunk_length) or self.chunk_length < 1:
            raise ConfigError("policy.chunk_length", "must be an integer >= 1", self.chunk_length)
        super().validate()

    def score(self, stats: ScoreContext) -> torch.Tensor:
        g, real = raised_score(self._inner, stats)  # (L, B, H, N), (1, B, 1, N)
        L, B, H, N = g.shape
        c, n = self.chunk_length, stats.n.view(1, B, 1, 1)
        C = -(-N // c)
        summed = g.masked_fill(~real, 0.0).sum(dim=2)  # (L, B, N): over the KV heads
        summed = torch.nn.functional.pad(summed, (0, C * c - N)).view(L, B, C, c).sum(dim=-1)  # (L, B, C)
        start = torch.arange(C, device=g.device) * c  # (C,)
        count = (n.view(B, 1) - start).clamp(0, c)  # (B, C) each chunk's real pairs
        value = summed / count.clamp(min=1)
        newest = torch.arange(C, device=g.device) == (n.view(B, 1) - 1) // c  # (B, C)
        value = value.masked_fill(newest, float("inf"))
        out = value.repeat_interleave(c, dim=-1)[..., :N][:, :, None].expand(L, B, H, N)  # (L, B, H, N)
        return torch.where(n < c, g, out)  # shorter than one chunk: the inner score

    def score_bytes(self, *, layers, rows, kv_heads, q_heads, pairs, head_dim, elem) -> int:
        inner = self.inner_score_bytes(layers=layers, rows=rows, kv_heads=kv_heads, q_heads=q_heads, pairs=pairs,
                                       head_dim=head_dim, elem=elem)
        return inner + 4 * layers * rows * kv_heads * pairs * 4 + 4 * layers * rows * pairs * 4

    def describe(self, gqa: bool = False, paged: bool = False) -> dict:
        d = super().describe(gqa, paged)
        if self.evicts:
            d["extensions"] += ["the newest chunk is always kept (kvpress: when it ranks)", "each sample chooses its "
                                "own chunks (kvpress applies the first sample's choice to the whole batch)"]
        return d
