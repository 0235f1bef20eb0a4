"""SnapKV (Li et al., 2024): keep the pairs the last `window` queries (the observation window) attend
to most, their attention averaged over the window and pooled over neighbouring pairs.

score[i] = GQA group mean over query heads of pool_k( mean over window queries q of softmax_q(i) )

where softmax_q is query q's attention over the pairs held at the eviction that it may see
(position <= its own), pool_k an average (default) or max pooling of width `kernel` (5) over
neighbouring slots (slots are in position order) with zero padding, computed over the pairs OLDER than
the window: the window's own pairs are left out before pooling (their columns count as the padding), as
the published code and kvpress's SnapKVPress do (`pool_window=true`: kvbench's earlier variant, which
pooled across them), and they are always kept (`protect_recent` defaults to `window`). Defaults as the
published code and kvpress: window 64, kernel 5, average pooling; token for token against kvpress in
results/crosscheck/ (`make crosscheck`).

What the window is: the newest `window` queries processed before the eviction, whatever forwards
they came from (the cache keeps them: `query_window`). Under decode_only at the first compression
these are the prompt's last `window` queries attending over the whole prompt: the published method.
Under prefill_and_decode at a block boundary they are the last `window` prompt positions processed so
far (the tail of the block just processed, reaching into earlier blocks when p < window), and their
attention is recomputed over the pairs held now (kv_size of them, not the whole prefix: a departure,
in `extensions`); while decoding they are the newest generated tokens (and prompt tail).

With `rerotate=true` the kept queries are rotated by the slot shift of the newest pairs (their own
pairs when the window is protected, the default), so they stay at their own pairs' positions.

Computed `LAYER_CHUNK` layers at a time: the logits of a chunk are (l, B, H_q, W, N) float32.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from kvbench.budgets import is_int
from kvbench.errors import ConfigError
from kvbench.policies.policy import AFTER_PREFILL, Needs, Policy, ScoreContext

POOLINGS = ("max", "avg")
LAYER_CHUNK = 4


@dataclass
class SnapKV(Policy):
    kv_size: int | None = 256
    evict_every: int = 64
    schedule: str = "decode_only"
    protect_recent: int | None = None  # None: window (the observation window is kept, as published)
    window: int = 64
    kernel: int = 5
    pooling: str = "avg"
    pool_window: bool = False  # True: pool over the window's own pairs too (kvbench's earlier variant)
    name: ClassVar[str] = "snapkv"
    label: ClassVar[str] = "SnapKV"
    summary: ClassVar[str] = "the last `window` queries' attention, averaged, pooled over `kernel` neighbours; the window kept"
    paper: ClassVar[tuple[str, str]] = ("Li et al., NeurIPS 2024", "https://arxiv.org/abs/2404.14469")
    published_schedule: ClassVar[str] = AFTER_PREFILL
    gqa_note: ClassVar[str] = "GQA models: pooled per query head, then averaged over the query heads of a KV group"

    @property
    def needs(self) -> Needs:
        return Needs(keys=True, queries=self.window)  # the keys and the newest `window` queries

    def validate(self) -> None:
        if not is_int(self.window) or self.window <= 0:
            raise ConfigError("policy.window", "must be a positive integer", self.window)
        if not is_int(self.kernel) or self.kernel <= 0 or self.kernel % 2 == 0:
            raise ConfigError("policy.kernel", "must be a positive odd integer", self.kernel)
        if self.pooling not in POOLINGS:
            raise ConfigError("policy.pooling", f"must be one of {', '.join(POOLINGS)}", self.pooling)
        if not isinstance(self.pool_window, bool):
            raise ConfigError("policy.pool_window", "must be true or false", self.pool_window)
        own_window = self.protect_recent is None
        if own_window:
            self.protect_recent = self.window
        try:
            super().validate()
        except ConfigError as e:
            if own_window and e.key == "policy.protect_recent":  # the user set the window, not protect_recent
                keep = self.kv_size - self.evict_every
                raise ConfigError("policy.window", f"the observation window is kept (protect_recent=null): with "
                                  f"protect_first={self.protect_first} it must not exceed kv_size - evict_every = "
                                  f"{keep} (an eviction must leave pairs to choose from)", self.window) from None
            raise

    def score(self, stats: ScoreContext) -> torch.Tensor:
        keys, queries = stats.keys, stats.queries  # (L, B, H, N, D), (L, B, Hq, W, D)
        L, B, H, N, D = keys.shape
        Hq, W = queries.shape[2], queries.shape[3]
        G = Hq // H
        scale = stats.scale if stats.scale is not None else D**-0.5
        qpos = stats.query_pos[:, :, :, None, :, None]  # (1, B, 1, 1, W, 1)
        qreal = qpos >= 0  # fewer than W queries processed: empty entries give no weight
        count = qreal.sum(dim=4).clamp(min=1)  # (1, B, 1, 1, 1): the real window queries, for their mean
        start = torch.where(qreal, qpos, torch.iinfo(qpos.dtype).max).amin(dim=4)  # (1, B, 1, 1, 1) window's first
        slot_ok = (torch.arange(N, device=keys.device) < stats.n)[:, :, :, None, None, :]  # (1, B, 1, 1, 1, N)
        out = torch.empty(L, B, H, N, dtype=torch.float32, device=keys.device)
        for l0 in range(0, L, LAYER_CHUNK):
            l1 = min(L, l0 + LAYER_CHUNK)
            q = queries[l0:l1].reshape(l1 - l0, B, H, G * W, D)  # heads of a group adjacent
            s = (q @ keys[l0:l1].transpose(-1, -2)).float().view(l1 - l0, B, H, G, W, N) * scale
            hide = (stats.pos[l0:l1, :, :, None, None, :] > qpos) | ~slot_ok  # causal, held slots only
            s.masked_fill_(hide, float("-inf"))
            del hide
            w = torch.softmax(s, dim=-1).nan_to_num_(0.0)  # a query that sees no pair gives nothing
            del s
            w = w.mul_(qreal).sum(dim=4).div_(count)  # (l, B, H, G, N): averaged over the window
            if not self.pool_window:  # the window's own pairs are left out: zeros, like the pooling's padding
                w.masked_fill_(stats.pos[l0:l1, :, :, None, :] >= start, 0.0)
            flat = w.reshape(-1, 1, N)
            pad = self.kernel // 2
            if self.pooling == "max":
                flat = F.max_pool1d(flat, self.kernel, stride=1, padding=pad)
            else:
                flat = F.avg_pool1d(flat, self.kernel, stride=1, padding=pad)  # zero padding counted, as published
            out[l0:l1] = flat.view(l1 - l0, B, H, G, N).mean(dim=3)  # GQA: group mean
        return out

    def score_bytes(self, *, layers, rows, kv_heads, q_heads, pairs, head_dim, elem) -> int:
        lc = min(LAYER_CHUNK, layers)
        per = max(8, 4 + elem if elem != 4 else 4)  # float32 logits + their model-dtype source, or + the weights
        logits = lc * rows * q_heads * self.window * pairs * per
        return logits + 2 * lc * rows * kv_heads * self.window * pairs + 3 * lc * rows * q_heads * pairs * 4

    def describe(self, gqa: bool = False, paged: bool = False) -> dict:
        d = super().describe(gqa, paged)
        ext = [e for e in d["extensions"] if e != f"protect_recent={self.window}"]  # its own window
        if self.evicts and self.pool_window:
            ext.append("pool_window: the window's own pairs pooled with their neighbours (published: left out "
                       "before pooling)")
        if self.evicts_in_prefill:
            held = "budget's" if self.kv_size is None else f"{self.kv_size}"
            ext.append(f"prefill: the last {self.window} queries before each block attend over the {held} "
                       "pairs held (published: over the whole prompt)")
        d["extensions"] = ext
        return d
