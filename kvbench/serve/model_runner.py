"""The model runner: one forward over the scheduled chunks, greedy next tokens. It only runs.

Owns the paged pool (and, for SnapKV-like policies, each request's query window). `step(scheduled)`
writes the chunk positions into the pool, runs the model on the packed tokens with explicit
`position_ids` (true positions: after an eviction the kept keys keep their RoPE and new queries their real
position), keeps logits only for the requests whose chunk reaches the end of their sequence, and returns
their greedy next tokens. `evictor` scores a request's blocks for eviction from the pool's statistics with
the policy's `score()` (kvbench.serve.block_evict: the same blocks everywhere, or each (layer, KV head) its own).
"""

from __future__ import annotations

import torch

from kvbench.attention import SCORE_CHUNK
from kvbench.attention.interface import attention_modules
from kvbench.cache.rotate import rotate
from kvbench.errors import ConfigError
from kvbench.models.family import kinds
from kvbench.models.geometry import model_geometry, rope_inv_freq
from kvbench.policies.policy import Policy
from kvbench.serve.block_evict import block_scores, choose
from kvbench.serve.observe import Observers
from kvbench.serve.page_layout import Layout
from kvbench.serve.paged_attention import PagedStep
from kvbench.serve.paged_attention import backend as attention_backend
from kvbench.serve.pool import PagedPool
from kvbench.serve.qpool import QuantPagedPool
from kvbench.serve.queries import QueryWindows
from kvbench.serve.request import Request
from kvbench.serve.request_passes import Passes
from kvbench.serve.scheduler import Scheduled
from kvbench.serve.score_context import request_stats


class ModelRunner:
    def __init__(self, model, num_blocks: int, block_size: int, policy: Policy, block_score: str = "sum",
                 rotate: bool = False, per_head: bool = False, score_chunk: int = SCORE_CHUNK, k=None, kv_quant=None,
                 window_pages: int = 0):
        """kv_quant: K/V stored quantized (kvbench.quant.qconfig.KVQuant; kvbench.serve.qpool, with `window_pages`
        full-precision pages), None: in the model's dtype."""
        k = kinds(model.config) if k is None else k  # the model's attention kinds, read once per run
        geo = model_geometry(model, k)
        if not k.plain:  # kvbench.config.preflight refuses it first on the command line
            raise ConfigError("mode", f"serve mode runs full attention only; model family {k.family!r} has "
                              f"{k.describe()} (run it with mode=run)", "serve")
        devices = set(geo["layer_devices"])
        if len(devices) != 1:
            raise ValueError("serve mode runs on one device (the model is split across several)")
        self.model, self.policy, self.block_score, self.per_head = model, policy, block_score, per_head
        self.score_chunk = score_chunk
        self.start_blocks = -(-policy.protect_first // block_size) if policy.evicts else 0
        self.device = model.get_input_embeddings().weight.device
        self.inv_freq = rope_inv_freq(model).detach().float().cpu() if rotate else None
        L, H = len(geo["layer_devices"]), geo["num_kv_heads"]
        self.shape = (L, H)
        pool = dict(
            num_layers=L, num_blocks=num_blocks, block_size=block_size, num_kv_heads=H, head_dim=geo["head_dim"],
            dtype=geo["dtype"], device=self.device, track_attention=policy.needs.attention, rerotate=rotate,
            pair_state=policy.needs.pair_state if policy.needs.observes else (),
        )
        self.pool = PagedPool(**pool) if kv_quant is None else QuantPagedPool(**pool, quant=kv_quant,
                                                                              window_pages=window_pages)
        self.observers = Observers(policy, policy.needs.row_shapes(model.config.num_attention_heads, H, geo["head_dim"]),
                                   L, self.device, getattr(model.get_decoder(), "rotary_emb", None),
                                   attention_modules(model)) if (
            policy.needs.observes) else None
        self.windows = QueryWindows(policy.needs.queries, L, model.config.num_attention_heads, geo["head_dim"],
                                    geo["dtype"], self.device) if policy.evicts and policy.needs.queries else None
        self.passes = Passes(model, self.pool, policy, self.device) if policy.evicts and policy.needs.passes else None
        self.attention = attention_backend(self.device, geo["dtype"], policy.needs.attention, block_size,
                                           kv_quant is not None)

    @torch.inference_mode()
    def step(self, scheduled: list[Scheduled]) -> dict[int, int]:
        """Run one forward; returns {request id: next token} for requests that completed their sequence."""
        reqs = [s.req for s in scheduled]
        k = [s.num_tokens for s in scheduled]
        lay = Layout.build(self.pool.block_size, [r.pages for r in reqs], [r.held for r in reqs], k,
                           [r.num_computed for r in reqs], self.device, rotary=self.inv_freq is not None)
        self.pool.prepare([r.pages for r in reqs], [r.held for r in reqs], k)
        self.pool.pos[lay.write] = lay.source[None, :, None].expand(lay.write.shape)
        if self.pool.rot is not None:  # the rotary position each key is written at: its slot
            self.pool.rot[lay.write] = lay.positions[0][None, :, None].expand(lay.write.shape)
        if self.windows is not None:
            self.windows.prepare([r.rid for r in reqs], [r.num_computed for r in reqs], k,
                                 [r.num_computed == 0 for r in reqs])
        if self.observers is not None:
            self.observers.prepare([r.rid for r in reqs], [r.num_computed for r in reqs], k,
                                   [r.num_computed == 0 for r in reqs])
        step = PagedStep(self.pool, lay, self.attention, self.score_chunk, self.windows, self.observers)
        ids = torch.tensor([t for r, n in zip(reqs, k, strict=True) for t in r.tokens(n)], dtype=torch.long)
        done = [i for i, (r, n) in enumerate(zip(reqs, k, strict=True)) if r.num_computed + n == r.seq_len]
        out = {}
        kw = dict(
            input_ids=ids[None].to(self.device), position_ids=lay.positions, use_cache=False,
            kvbench_step=step,
        )
        if done:
            keep = lay.last[torch.tensor(done, device=self.device)]
            logits = self.model(**kw, logits_to_keep=keep).logits[0]  # (len(done), V)
            nxt = logits.argmax(-1).tolist()
            out = {reqs[i].rid: t for i, t in zip(done, nxt, strict=True)}
        else:  # prefill chunks only: no logits
            self.model.get_decoder()(**kw)
        return out

    def forget(self, req: Request) -> None:
        """The request finished or was preempted: its query window goes."""
        if self.windows is not None:
            self.windows.forget(req.rid)
        if self.observers is not None:
            self.observers.forget(req.rid)
        if self.passes is not None:
            self.passes.forget(req.rid)

    @torch.inference_mode()
    def rerotate(self, req: Request) -> None:
        """After `req` lost blocks: every kept key of it, in every layer, afresh from its written copy, rotated
        from the slot it was written at to the logical slot it holds now (cache rotation, no compounding)."""
        slots, _ = self.pool.slots(req.pages, req.held)  # (L, H, N): one count everywhere (rerotate's rule)
        slots = slots.to(self.device)
        delta = torch.arange(slots.shape[-1], device=self.device) - self.pool.rot[slots]  # (L, H, N)
        self.pool.k[slots] = rotate(self.pool.k_src[slots], delta, self.inv_freq)  # (L, H, N, D)

    @torch.inference_mode()
    def evictor(self, req: Request, end: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        """(L, H, nb) bool: the n[l, h] lowest-scored evictable blocks of each (layer, KV head) of `req` (its
        policy's pair scores, aggregated per block; summed over layers and heads unless `per_head`)."""
        parts = request_stats(self.pool, self.windows, req, self.policy, self.device, self.observers, self._passed(req))
        if self.passes is not None:  # a scoring pass's statistic serves one compression
            self.passes.forget(req.rid)
        if len(parts) == 1:
            scores = block_scores(self.policy, parts[0], self.pool.block_size, self.block_score, self.per_head)
        else:  # heads hold different counts: one layer at a time
            scores = torch.cat([block_scores(self.policy, st, self.pool.block_size, self.block_score, True)
                                for st in parts])
        return choose(scores.cpu(), self.start_blocks, end, n)

    def _passed(self, req: Request) -> torch.Tensor | None:
        """The policy's scoring passes' statistic for `req` at its compression point (run then), or None."""
        return None if self.passes is None else self.passes.get(req)

    @torch.inference_mode()
    def reallocate(self, req: Request) -> None:
        """head_budget=adaptive, when `req` compresses: each layer's pairs split across its KV heads by the policy's
        scores (the policy's head rule, kvbench.budgets: AdaKV's), the protected start and recent areas counted first."""
        from kvbench.budgets import head_rule, layer_rule

        held = req.held.to(self.device)  # (L, H): every head holds the whole prompt (nothing evicted yet)
        budget = torch.minimum(req.budget[:, 0].to(self.device), held[:, 0])  # (L,) pairs per head on average
        if bool((budget >= held[:, 0]).all()):
            return
        (stats,) = request_stats(self.pool, self.windows, req, self.policy, self.device, self.observers,
                                 self._passed(req))
        s = self.policy.score(stats).float().expand(stats.pos.shape)[:, 0].clone()  # (L, H, N)
        N = s.shape[-1]
        j = torch.arange(N, device=self.device)
        protected = (j < self.start_blocks * self.pool.block_size) | (j >= N - req.recent.to(self.device)[..., None])
        s.masked_fill_(protected, float("inf"))
        if layer_rule(self.policy).varies:  # layers of their own budgets: each its own table (the cache's groups)
            counts = head_rule(self.policy).counts(self.policy, s[None], budget)[0]  # (L, H): layers as samples
        else:  # one table over every layer (the static cache's one group): head_budget=global ranks it whole
            counts = head_rule(self.policy).counts(self.policy, s[:, None], budget[:1])[:, 0]  # (L, H)
        req.budget = counts.cpu()
