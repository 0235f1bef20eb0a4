"""What `generate` returns: the tokens, the timings, the memory and the budgets a run held."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvbench import memory


@dataclass
class GenerationOutput:
    token_ids: list[list[int]]  # generated ids per prompt (up to and including EOS unless ignore_eos)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    wall_s: float = 0.0
    evict_s: float = 0.0  # inside evictions (and decode_only's resize), prefill and decode (kvbench.timing)
    attn_stats_s: float | None = 0.0  # the separate statistics pass (scored policies, sdpa/flash); None when the
    # backend computes the statistics from the output's own probabilities (eager, fused): not separable
    score_pass_s: float = 0.0  # a policy's scoring passes (KVzip's reconstruction), part of prefill_s
    generated_tokens: int = 0  # tokens the batches produced (finished samples' pad steps excluded)
    peak_kv_bytes: int = 0  # most KV bytes held at once (kept pairs)
    kv_allocated_bytes: int = 0  # largest cache allocation (slots, positions, statistics)
    decode_kv_bytes_sum: int = 0  # the cache's allocation summed over decode steps (every batch's)
    decode_kv_bytes_peak: int = 0  # its largest during a decode step
    decode_steps: int = 0
    held_pairs: int = 0  # pairs the caches held at the end of each batch (every layer, KV head, sample), summed
    brought_pairs: int = 0  # pairs the tokens they processed brought (the full cache's count), summed
    accounted: memory.Account | None = None  # the largest accounted peak of a batch
    batches: int = 0
    prompt_tokens: list[int] = field(default_factory=list)
    attention: str = ""  # the attention backend really used (kvbench.attention.resolve)
    budget_min: int | None = None  # the smallest and largest budget of a (layer, sample) over the batches
    budget_max: int | None = None
    budget_per_layer: bool = False  # layers held different budgets (PyramidKV)

    def note_budgets(self, k: torch.Tensor | None) -> None:
        """Widen the budget range by a batch's (L, B) budgets (None: the full cache)."""
        if k is None:
            return
        self.budget_min = int(k.min()) if self.budget_min is None else min(self.budget_min, int(k.min()))
        self.budget_max = int(k.max()) if self.budget_max is None else max(self.budget_max, int(k.max()))
        self.budget_per_layer = self.budget_per_layer or bool((k != k[:1]).any())

    def add(self, tokens: list[list[int]], stats: dict) -> None:
        """Add one batch's tokens and stats (`kvbench.engine.loop.generate_batch`)."""
        self.token_ids += tokens
        self.prefill_s += stats["prefill_s"]
        self.decode_s += stats["decode_s"]
        self.evict_s += stats["evict_s"]
        self.attn_stats_s += stats["attn_stats_s"]
        self.score_pass_s += stats.get("score_pass_s", 0.0)
        self.generated_tokens += stats["generated_tokens"]
        self.peak_kv_bytes = max(self.peak_kv_bytes, stats["peak_kv_bytes"])
        self.kv_allocated_bytes = max(self.kv_allocated_bytes, stats["kv_allocated_bytes"])
        held = stats.get("decode_kv_bytes", [])
        self.decode_kv_bytes_sum += sum(held)
        self.decode_kv_bytes_peak = max([self.decode_kv_bytes_peak, *held])
        self.decode_steps += len(held)
        kept, brought = stats.get("kept_pairs", (0, 0))
        self.held_pairs, self.brought_pairs = self.held_pairs + kept, self.brought_pairs + brought
        self.note_budgets(stats["budgets"])
        self.batches += 1

    @property
    def decode_kv_bytes_mean(self) -> int | None:
        """The cache's allocated bytes during a decode step, on average over every batch's decode steps."""
        return self.decode_kv_bytes_sum // self.decode_steps if self.decode_steps else None

    @property
    def kv_kept_share(self) -> float | None:
        """The share of the pairs its tokens brought that the cache held at the end (every batch, layer, KV head and
        sample): the compression really reached, e.g. under a threshold, where it is not set."""
        return round(self.held_pairs / self.brought_pairs, 4) if self.brought_pairs else None

    @property
    def throughput_tok_s(self) -> float:
        return self.generated_tokens / self.wall_s if self.wall_s > 0 else 0.0
