"""The eviction-policy interface.

A policy is a small dataclass whose fields are its hyper-parameters and which only scores cached
pairs (higher = keep). Everything mechanical (when to evict, top-k, gathering kept pairs back in
position order, protected pairs) lives once in `kvbench.cache.KVCache.evict` and `kvbench.engine`.

Phase flags instead of type checks: the engine asks `evicts_in_prefill` / `evicts_in_decode`,
`needs_attention` (collect attention statistics while running), `needs_keys` (the cached keys in
the score statistics), `query_window` (how many of the newest queries the cache keeps for the score,
0: none) and `budgets(...)` / `capacities(...)` (the pairs each layer of each sample may hold, and
the slots to preallocate per layer), never `isinstance`. `keeps_newest`
says the order of the pairs is known without scores (the score is the position): the cache then
keeps the `protect_first` sinks and the newest pairs by slicing, with no score, sort or gather.

Schedules: `prefill_and_decode` (Algorithm 1: p pairs go whenever a block would overflow the budget, in
prefill and decode), `decode_only` (the whole prompt first, then the same while decoding) and
`after_prefill` (kvpress's and SnapKV's protocol: the prompt is compressed once, right after prefill, to
its budget, and every generated token is kept; `evict_every` plays no part).

Budgets: `kv_size` pairs per (layer, sample); or per sample, `kv_ratio` (ceil(ratio x its prompt length))
or `compression_ratio` (kvpress's kept count, int(prompt length x (1 - compression_ratio))): samples of
one batch then hold different budgets. A budget is never below `min_budget` (evict_every + the protected
pairs + 1: an eviction must leave a choice; 1 under after_prefill, which keeps exactly the budget);
`layer_budgets` may give layers different budgets (PyramidKV); `recent_pairs` says how many of the newest
pairs a budget protects (H2O: half of it).

Departures from the published method (`describe()["extensions"]`, in every record) are derived from
what a policy declares: `published_schedule` (decode_only, prefill_and_decode, or after_prefill: a
one-off compression of the prompt), `published_evict_every` (1 for the per-token methods) and
`gqa_note` (how its score aggregates the query heads of a KV group, said on GQA models only).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import ClassVar

import torch

from kvbench.errors import ConfigError

AFTER_PREFILL = "after_prefill"  # compress the prompt once, right after prefill, then keep every generated token
SCHEDULES = ("prefill_and_decode", "decode_only", AFTER_PREFILL)


@dataclass
class ScoreStats:
    """What a policy may look at, for the samples being evicted; all shapes (L, B, H_kv, N).

    pos:    source position of each cached pair (int)
    sum_w:  attention weight each pair received, summed over every processed query (float32),
            averaged over the query heads of a KV group; None unless `needs_attention`
    last_w: the weights the newest query gave (float32); None unless `needs_attention`
    last:   (1, B, 1, 1) last position processed so far, per sample
    n:      (1, B, 1, 1) pairs held per sample (slots >= n are empty)
    layers: (L, 1, 1, 1) absolute index of each layer (a cache may split layers over devices)

    Extensions (filled only for the policies that ask, so the others pay nothing):
    keys:    (L, B, H_kv, N, D) the cached keys, as stored (RoPE applied); when `needs_keys`
    queries: (L, B, H_q, W, D) the newest W = `query_window` queries processed, RoPE applied, oldest
             first, whatever forwards they came from; when `query_window` > 0
    query_pos: (1, B, 1, W) their source positions, -1 for an empty entry (fewer than W processed)
    scale:   the attention's softmax scale (the model's, usually D ** -0.5)
    """

    pos: torch.Tensor
    last: torch.Tensor
    sum_w: torch.Tensor | None = None
    last_w: torch.Tensor | None = None
    n: torch.Tensor | None = None
    layers: torch.Tensor | None = None
    keys: torch.Tensor | None = None
    queries: torch.Tensor | None = None
    query_pos: torch.Tensor | None = None
    scale: float | None = None


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


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

    name: ClassVar[str] = "base"
    published_schedule: ClassVar[str | None] = None  # None: no published schedule to depart from
    published_evict_every: ClassVar[int | None] = None  # e.g. 1: published as one pair per token
    gqa_note: ClassVar[str | None] = None  # the departure on GQA models (several query heads per KV head)
    needs_attention: ClassVar[bool] = False
    # True: `score` is the position (newer = keep), so an eviction keeps the protect_first sinks and the
    # newest pairs; KVCache.evict slices them into place instead of scoring, sorting and gathering
    keeps_newest: ClassVar[bool] = False
    needs_keys: ClassVar[bool] = False
    # keys of the policy's config that play no part in what it runs (full: every budget and schedule key): in a
    # sweep they are reset to the policy's own defaults and named in the record's `ignored_keys` (kvbench.config)
    inert_keys: ClassVar[tuple[str, ...]] = ()

    @property
    def query_window(self) -> int:
        """How many of the newest queries the cache must keep for `score` (0: none)."""
        return 0

    def __post_init__(self):
        self.validate()

    # ----------------------------------------------------------------- validation
    def validate(self) -> None:
        p = "policy"
        if self.kv_ratio is not None:
            if isinstance(self.kv_ratio, bool) or not isinstance(self.kv_ratio, (int, float)) or not (
                    0 < self.kv_ratio <= 1):
                raise ConfigError(f"{p}.kv_ratio", "must be a share of the prompt in (0, 1], or null", self.kv_ratio)
            self.kv_ratio = float(self.kv_ratio)
            self.kv_size = None  # the budget is per prompt: kv_ratio replaces kv_size
        if self.compression_ratio is not None:
            cr = self.compression_ratio
            if isinstance(cr, bool) or not isinstance(cr, (int, float)) or not (0 <= cr < 1):
                raise ConfigError(f"{p}.compression_ratio", "must be the share of the prompt evicted, in [0, 1), or "
                                  "null", cr)
            if self.kv_ratio is not None:
                raise ConfigError(f"{p}.compression_ratio", "and policy.kv_ratio both give a budget per prompt: "
                                  "set one", cr)
            self.compression_ratio = float(cr)
            self.kv_size = None  # the budget is per prompt: compression_ratio replaces kv_size
        if self.kv_size is not None and (not _is_int(self.kv_size) or self.kv_size <= 0):
            raise ConfigError(f"{p}.kv_size", "must be a positive integer", self.kv_size)
        if not _is_int(self.evict_every) or self.evict_every <= 0:
            raise ConfigError(f"{p}.evict_every", "must be a positive integer", self.evict_every)
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"{p}.schedule", f"must be one of {', '.join(SCHEDULES)}", self.schedule)
        if not isinstance(self.rerotate, bool):
            raise ConfigError(f"{p}.rerotate", "must be true or false", self.rerotate)
        for key in ("protect_first", "protect_recent"):
            v = getattr(self, key)
            if not _is_int(v) or v < 0:
                raise ConfigError(f"{p}.{key}", "must be a non-negative integer", v)
        if self.kv_size is None:
            return
        if self.once:  # one compression to exactly the budget: the protected pairs must fit it
            if self.protect_first + self.protect_recent > self.kv_size:
                raise ConfigError(f"{p}.protect_recent", f"protect_first + protect_recent = "
                                  f"{self.protect_first + self.protect_recent} must not exceed kv_size = {self.kv_size}",
                                  self.protect_recent)
            return
        if self.evict_every >= self.kv_size:
            raise ConfigError(
                f"{p}.evict_every",
                f"must be smaller than policy.kv_size={self.kv_size} (an eviction must leave pairs)",
                self.evict_every,
            )
        keep = self.kv_size - self.evict_every
        if self.protect_first + self.protect_recent > keep:
            raise ConfigError(
                f"{p}.protect_recent",
                f"protect_first + protect_recent = {self.protect_first + self.protect_recent} must not exceed "
                f"kv_size - evict_every = {keep}",
                self.protect_recent,
            )

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

    def keep(self, budget):
        """Pairs a sample keeps after an eviction under `budget`: |kv| - p (Algorithm 1), or the budget itself
        under after_prefill (one compression to exactly the budget)."""
        return budget if self.once else budget - self.evict_every

    @property
    def keep_after_evict(self) -> int:
        """Pairs a sample holds right after an eviction under a kv_size budget: `keep(kv_size)`."""
        assert self.kv_size is not None
        return self.keep(self.kv_size)

    @property
    def min_budget(self) -> int:
        """The smallest budget an eviction can honour: evict_every pairs go, the protected ones and one more stay
        (after_prefill keeps exactly the budget: 1)."""
        return 1 if self.once else self.evict_every + self.protect_first + self.protect_recent + 1

    def recent_pairs(self, budgets: torch.Tensor) -> torch.Tensor:
        """The newest pairs protected in samples holding these budgets (same shape): `protect_recent`."""
        return torch.full_like(budgets, self.protect_recent)

    def sample_budgets(self, lengths: list[int]) -> torch.Tensor:
        """(B,) pairs each sample may hold: kv_size, or ceil(kv_ratio x its prompt length), or int(its prompt
        length x (1 - compression_ratio)), at least min_budget."""
        if self.kv_ratio is not None:
            want = [math.ceil(self.kv_ratio * s) for s in lengths]
        elif self.compression_ratio is not None:
            want = [int(s * (1 - self.compression_ratio)) for s in lengths]
        else:
            return torch.full((len(lengths),), self.kv_size, dtype=torch.long, device="cpu")
        return torch.tensor([max(self.min_budget, k) for k in want], dtype=torch.long, device="cpu")

    def layer_budgets(self, per_sample: torch.Tensor, layers: int, lengths: list[int] | None = None) -> torch.Tensor:
        """(L, B) budget of each layer of each sample from the samples' budgets (B,) (and their prompts' lengths):
        the same in every layer."""
        return per_sample[None, :].expand(layers, -1).clone()

    def budgets(self, lengths: list[int], layers: int) -> torch.Tensor | None:
        """(L, B) pairs layer l of sample b may hold at any point; None for the full cache."""
        if not self.evicts:
            return None
        return self.layer_budgets(self.sample_budgets(lengths), layers, lengths)

    def capacities(self, lengths: list[int], max_new_tokens: int, budgets: torch.Tensor | None) -> list[int]:
        """Slots to preallocate per layer (all samples alike: the cache is one tensor per group of layers)."""
        longest = max(lengths)
        if budgets is None:
            return [longest + max_new_tokens]
        most = budgets.max(dim=1).values.tolist()  # (L,)
        if self.evicts_in_prefill:
            return most
        return [max(self.decode_capacity(k, max_new_tokens), longest) for k in most]  # the whole prompt first

    def decode_capacity(self, budget: int, max_new_tokens: int) -> int:
        """Slots a layer needs once the prompt is compressed to `budget`: the budget, or under after_prefill the
        budget and every generated token."""
        return budget + max_new_tokens if self.once else budget

    # ----------------------------------------------------------------- scoring
    def score(self, stats: ScoreStats) -> torch.Tensor:
        """Higher = keep. Shape (L, B, H_kv, N) like the stats."""
        raise NotImplementedError(f"policy {self.name} does not score pairs")

    def score_bytes(self, *, layers: int, rows: int, kv_heads: int, q_heads: int, pairs: int, head_dim: int,
                    elem: int) -> int:
        """Transient bytes `score` allocates beyond its (L, B, H_kv, N) result (kvbench.memory's account)."""
        return 0

    # ----------------------------------------------------------------- reporting
    def schedule_departures(self) -> list[str]:
        """How `schedule` departs from `published_schedule` (nothing when it is the published one)."""
        published, pd = self.published_schedule, self.schedule == "prefill_and_decode"
        if self.once:
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

    def describe(self, gqa: bool = False, paged: bool = False) -> dict:
        """Hyper-parameters and the ways this run departs from the published method (`gqa`: the model has
        several query heads per KV head; `paged`: mode=serve, which evicts whole blocks, not evict_every pairs)."""
        d = {"policy": self.name, **asdict(self)}
        ext = []
        if self.evicts:
            ext += self.schedule_departures()
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
                       f"{self.min_budget} pairs" + ("" if self.once else ", and stays that size while decoding"))
        if self.compression_ratio is not None:
            ext.append(f"compression_ratio={self.compression_ratio:g}: each sample keeps int(its prompt x "
                       f"{1 - self.compression_ratio:g}) pairs (kvpress's count), at least {self.min_budget}")
        d["extensions"] = ext
        return d
