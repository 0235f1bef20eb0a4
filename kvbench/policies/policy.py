"""The eviction-policy interface.

A policy is a small dataclass whose fields are its hyper-parameters and which only scores cached
pairs (higher = keep). Everything mechanical (when to evict, top-k, gathering kept pairs back in
position order, protected pairs) lives once in `kvbench.cache.KVCache.evict` and `kvbench.engine`.

Phase flags instead of type checks: the engine asks `evicts_in_prefill` / `evicts_in_decode` and
`needs` (kvbench.policies.needs.Needs: what the score reads, so only that is kept), never `isinstance`. `keeps_newest` says the order of the pairs is known without scores (the
score is the position): the cache then keeps the `protect_first` sinks and the newest pairs by slicing,
with no score, sort or gather.

Schedules: `prefill_and_decode` (Algorithm 1: p pairs go whenever a block would overflow the budget, in
prefill and decode), `decode_only` (the whole prompt first, then the same while decoding) and
`after_prefill` (kvpress's and SnapKV's protocol: the prompt is compressed once, right after prefill, to
its budget, and every generated token is kept; `evict_every` plays no part).

Budgets (`kv_size`, `kv_ratio`, `compression_ratio`, `head_budget`, `head_floor`) are knobs here; their
arithmetic (min_budget, what an eviction keeps, capacities) and the budget rules (how a layer's pairs spread over
its KV heads: `head_budget` names a head rule, AdaKV's `adaptive` among them; how a sample's budget spreads over
its layers: `layer_budget`, a class's choice, PyramidKV's `pyramid`) are kvbench.budgets'.

Departures from the published method (`describe()["extensions"]`, in every record) are derived from
what a policy declares: `published_schedule` (decode_only, prefill_and_decode, or after_prefill: a
one-off compression of the prompt), `published_evict_every` (1 for the per-token methods) and
`gqa_note` (how its score aggregates the query heads of a KV group, said on GQA models only).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

import torch

from kvbench import budgets
from kvbench.budgets import AFTER_PREFILL, SCHEDULES
from kvbench.policies.needs import Needs

__all__ = ["AFTER_PREFILL", "SCHEDULES", "Needs", "Policy", "ScoreContext"]


@dataclass
class ScoreContext:
    """What a policy's `score` sees, for the samples being evicted; all shapes (L, B, H_kv, N). The same object
    in static mode (kvbench.cache.evict) and serve mode (kvbench.serve.score_context).

    pos:    source position of each cached pair (int)
    sum_w:  attention weight each pair received, summed over every processed query (float32),
            averaged over the query heads of a KV group; None unless `needs.attention`
    last_w: the weights the newest query gave (float32); None unless `needs.attention`
    last:   (1, B, 1, 1) last position processed so far, per sample
    n:      (1, B, 1, 1) pairs held per sample (slots >= n are empty)
    layers: (L, 1, 1, 1) absolute index of each layer (a cache may split layers over devices)

    Filled only for the policies that declare them in `needs`, so the others pay nothing:
    keys:    (L, B, H_kv, N, D) the cached keys, as stored (RoPE applied); when `needs.keys`
    values:  (L, B, H_kv, N, D) the cached values; when `needs.values`
    queries: (L, B, H_q, W, D) the newest W = `needs.queries` queries processed, RoPE applied, oldest
             first, whatever forwards they came from; when `needs.queries` > 0
    query_pos: (1, B, 1, W) their source positions, -1 for an empty entry (fewer than W processed)
    scale:   the attention's softmax scale (the model's, usually D ** -0.5)
    passed:  (L, B, H_kv, N) the running max of the policy's scoring passes' statistic (`pass_scores`), 0 for a
             pair no pass scored; when `needs.passes` (kvbench.attention.pass_step)
    pair:    {name: (L, B, H_kv, N) float32} the policy's own per-pair statistics (`needs.pair_state`)
    state:   {name: (L, B, *shape) float32} its own row state (`needs.row_state`), as `observe` left it
    modules: the attention modules of the L layers; rotary: the model's rotary embedding (`needs.module`)
    """

    pos: torch.Tensor
    last: torch.Tensor
    sum_w: torch.Tensor | None = None
    last_w: torch.Tensor | None = None
    n: torch.Tensor | None = None
    layers: torch.Tensor | None = None
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    queries: torch.Tensor | None = None
    query_pos: torch.Tensor | None = None
    scale: float | None = None
    passed: torch.Tensor | None = None
    pair: dict | None = None
    state: dict | None = None
    modules: list | None = None
    rotary: object = None


@dataclass
class Policy:
    """Base of every policy. `kv_size=None` (and no `kv_ratio`) means no eviction (the full cache)."""

    kv_size: int | None = None
    evict_every: int = 64
    schedule: str = "prefill_and_decode"
    protect_first: int = 0
    protect_recent: int = 0
    rerotate: bool = False  # re-rotate kept keys to contiguous positions (Llama-style RoPE)
    kv_ratio: float | None = None  # budget = this share of each sample's prompt (replaces kv_size when set)
    compression_ratio: float | None = None  # budget = int(prompt x (1 - this)), kvpress's (replaces kv_size)
    head_budget: str = "uniform"  # uniform: every KV head the layer's budget | adaptive: AdaKV's split by score
    head_floor: float = 0.2  # adaptive: the share of the budget each head keeps at least (kvpress's alpha_safeguard)

    name: ClassVar[str] = "base"
    label: ClassVar[str | None] = None  # the report's short name (a class's own; None: its name)
    # what the docs' policy tables say of it (docs/hooks/tables.py): the pairs it keeps, in a line, and its paper
    summary: ClassVar[str] = ""
    paper: ClassVar[tuple[str, str] | None] = None  # (citation, link), e.g. ("Zhang et al., NeurIPS 2023", "https://...")
    published_schedule: ClassVar[str | None] = None  # None: no published schedule to depart from
    published_evict_every: ClassVar[int | None] = None  # e.g. 1: published as one pair per token
    gqa_note: ClassVar[str | None] = None  # the departure on GQA models (several query heads per KV head)
    needs: ClassVar[Needs] = Needs()  # what `score` reads (kvbench.policies.needs); nothing by default
    # True: `score` is the position (newer = keep), so an eviction keeps the protect_first sinks and the newest pairs
    keeps_newest: ClassVar[bool] = False  # (KVCache.evict slices them into place instead of scoring, sorting, gathering)
    no_loglikelihood: ClassVar[str | None] = None  # why lm-eval's log-likelihood path can't run it yet (continuation)
    whole_prompt: ClassVar[str | None] = None  # why it scores the prompt in ONE forward (no prefill chunks; serve: whole)
    # keys of the policy's config that play no part in what it runs (full: every budget and schedule key): in a
    # sweep they are reset to the policy's own defaults and named in the record's `ignored_keys` (kvbench.config)
    inert_keys: ClassVar[tuple[str, ...]] = ()
    layer_budget: ClassVar[str] = "uniform"  # the layer rule (kvbench.budgets.rule): "pyramid" for PyramidKV
    # why it refuses other schedules than after_prefill / adaptive head budgets (budgets.validate; the matrix's oracle)
    after_prefill_only: ClassVar[str | None] = None
    uniform_heads_only: ClassVar[str | None] = None

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Check (and normalise) the knobs: ConfigError naming the key (kvbench.budgets.validate)."""
        budgets.validate(self)

    # ----------------------------------------------------------------- phase flags
    @property
    def evicts(self) -> bool:
        return self.kv_size is not None or self.kv_ratio is not None or self.compression_ratio is not None

    @property
    def evicts_in_prefill(self) -> bool:
        return self.evicts and self.schedule == "prefill_and_decode"

    @property
    def evicts_in_decode(self) -> bool:
        return self.evicts

    @property
    def once(self) -> bool:
        """schedule=after_prefill: one compression of the prompt, at the first decode step, to the budget."""
        return self.schedule == AFTER_PREFILL

    @property
    def per_prompt(self) -> str | None:
        """Which per-prompt budget is set: "kv_ratio", "compression_ratio", or None (kv_size, or no budget)."""
        return "kv_ratio" if self.kv_ratio is not None else "compression_ratio" if (
            self.compression_ratio is not None) else None

    # ----------------------------------------------------------------- scoring
    def check_model(self, config) -> None:  # preflight, from the model's config alone: ConfigError if it cannot run
        pass

    def prepare(self, tokenizer, model=None) -> None:
        """Once per run, before generating (kvbench.engine.generate): KVzip's template, DuoAttention's head pattern."""

    def scoring_passes(self, context: list[int]) -> list:
        """`needs.passes`: the passes over one row's context ids (ReplayPass: ids fed, positions [start, end))."""
        return []

    def pass_width(self, length: int) -> int:
        """`needs.passes`: the most tokens one pass over a context of `length` ids feeds (the memory account's)."""
        return 0

    def pass_bytes(self, **shape: int) -> int:  # rows, kv_heads, q_heads, tokens, pairs, head_dim, elem
        """`needs.passes`: transient bytes `pass_scores` allocates at one layer (kvbench.memory.pass_bytes)."""
        return 0

    def pass_scores(self, ctx) -> torch.Tensor:
        """`needs.passes`: (B, H_kv, N) statistic per held pair at one layer of one pass; max kept (ctx.passed)."""
        raise NotImplementedError(f"policy {self.name} runs no scoring pass")

    def score(self, stats: ScoreContext) -> torch.Tensor:
        """Higher = keep. Shape (L, B, H_kv, N) like the stats."""
        raise NotImplementedError(f"policy {self.name} does not score pairs")

    def observe(self, obs) -> dict | None:
        """Each forward and layer (`needs.observes`): update obs.state and/or return {pair_state: (B, H_kv, T)}."""
        return None

    def observe_bytes(self, **shape: int) -> int:  # rows, tokens, q_heads, kv_heads, head_dim, hidden, elem
        """Transient bytes `observe` allocates over one layer of a (rows, tokens) forward (kvbench.memory's account)."""
        return 0

    def weight_bytes(self, **shape) -> int:  # layers, hidden, kv_heads, elem; model: its name_or_path
        """Bytes of the weights it holds beside the model's for `layers` decoder layers on one device (KVzap's
        scorer; kvbench.memory's account charges them with the model's weights)."""
        return 0

    def score_bytes(self, *, layers: int, rows: int, kv_heads: int, q_heads: int, pairs: int, head_dim: int,
                    elem: int) -> int:
        """Transient bytes `score` allocates beyond its (L, B, H_kv, N) result (kvbench.memory's account)."""
        return 0

    # ----------------------------------------------------------------- reporting
    def describe(self, gqa: bool = False, paged: bool = False) -> dict:
        """Hyper-parameters and the ways this run departs from the published method (`gqa`: the model has
        several query heads per KV head; `paged`: mode=serve, which evicts whole blocks, not evict_every pairs)."""
        d = {"policy": self.name, **asdict(self)}
        ext = []
        if self.evicts:
            ext += schedule_departures(self.published_schedule, self.schedule)
        p = self.published_evict_every
        if self.evicts and not paged and not self.once and p is not None and self.evict_every != p:
            ext.append(f"evict_every={self.evict_every} (published: {self.published_evict_every} pair per token)")
        if gqa and self.evicts and self.gqa_note:
            ext.append(self.gqa_note)
        if self.protect_first:
            ext.append(f"protect_first={self.protect_first}")
        if self.protect_recent:
            ext.append(f"protect_recent={self.protect_recent}")
        if self.rerotate and self.evicts:
            ext.append("rerotate: kept keys re-rotated to contiguous positions, new tokens continue from the kept count")
        if self.kv_ratio is not None:
            ext.append(f"kv_ratio={self.kv_ratio:g}: each sample's budget is that share of its prompt, at least "
                       f"{budgets.min_budget(self)} pairs" + ("" if self.once else ", and stays that size while decoding"))
        if self.compression_ratio is not None:
            ext.append(f"compression_ratio={self.compression_ratio:g}: each sample keeps int(its prompt x "
                       f"{1 - self.compression_ratio:g}) pairs (kvpress's count), at least {budgets.min_budget(self)}")
        if self.evicts:
            ext += budgets.head_rule(self).extensions(self) + budgets.layer_rule(self).extensions(self)
            if (line := budgets.layer_rule(self).describe(self)) is not None:
                d["budgets"] = line
        d["extensions"] = ext
        return d


def schedule_departures(published: str | None, schedule: str) -> list[str]:
    """How a policy run under `schedule` departs from its `published_schedule` (nothing when it is the published
    one)."""
    pd = schedule == "prefill_and_decode"
    if schedule == AFTER_PREFILL:
        if published in (None, AFTER_PREFILL):
            return []
        was = "evicts while decoding" if published == "decode_only" else "evicts during prefill and decode"
        return [f"schedule=after_prefill: the prompt is compressed once after prefill, every generated token is "
                f"kept (published: {was})"]
    if published == AFTER_PREFILL:  # a one-off compression of the prompt (SnapKV, Knorm, KeyDiff, as in kvpress)
        ext = ["evicts during prefill, block by block (published: once, after the whole prompt)"] if pd else []
        return ext + ["evicts again whenever the cache is full while decoding (published: never)"]
    if published == "decode_only" and pd:
        return ["evicts during prefill too, block by block (published: decoding only)"]
    if published == "prefill_and_decode" and not pd:
        return ["schedule=decode_only: the whole prompt is held until the first decode step (published: evicts "
                "during prefill and decode)"]
    return []
