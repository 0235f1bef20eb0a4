"""The model runner: one forward over the scheduled chunks, greedy next tokens. It only runs.

Owns the paged pool. `step(scheduled)` writes the chunk positions into the pool, runs the model on
the packed tokens with explicit `position_ids` (true positions: after an eviction the kept keys
keep their RoPE and new queries their real position), keeps logits only for the requests whose
chunk reaches the end of their sequence, and returns their greedy next tokens. `block_scorer`
scores a request's blocks for eviction from the pool's statistics with the policy's `score()`.
"""

from __future__ import annotations

import torch

from kvbench.cache.rotate import rotate
from kvbench.errors import ConfigError
from kvbench.models.family import kinds
from kvbench.models.geometry import model_geometry, rope_inv_freq
from kvbench.policies.base import Policy, ScoreStats
from kvbench.serve.attention import backend as attention_backend
from kvbench.serve.evict import block_scores, choose_blocks
from kvbench.serve.pool import Layout, PagedPool
from kvbench.serve.request import Request
from kvbench.serve.scheduler import Scheduled


class ModelRunner:
    def __init__(self, model, num_blocks: int, block_size: int, policy: Policy, block_score: str = "sum",
                 rotate: bool = False):
        geo = model_geometry(model)
        k = kinds(model.config)
        if not k.plain:  # kvbench.preflight refuses it first on the command line
            raise ConfigError("mode", f"serve mode runs full attention only; model family {k.family!r} has "
                              f"{k.describe()} (run it with mode=run)", "serve")
        devices = set(geo["layer_devices"])
        if len(devices) != 1:
            raise ValueError("serve mode runs on one device (the model is split across several)")
        self.model, self.policy, self.block_score = model, policy, block_score
        self.device = model.get_input_embeddings().weight.device
        self.inv_freq = rope_inv_freq(model).detach().float().cpu() if rotate else None
        self.pool = PagedPool(
            num_layers=len(geo["layer_devices"]), num_blocks=num_blocks, block_size=block_size,
            num_kv_heads=geo["num_kv_heads"], head_dim=geo["head_dim"], dtype=geo["dtype"], device=self.device,
            track_attention=policy.needs_attention, rerotate=rotate,
        )
        self.attention = attention_backend(self.device, geo["dtype"], policy.needs_attention, block_size)

    @torch.inference_mode()
    def step(self, scheduled: list[Scheduled]) -> dict[int, int]:
        """Run one forward; returns {request id: next token} for requests that completed their sequence."""
        reqs = [s.req for s in scheduled]
        k = [s.num_tokens for s in scheduled]
        lay = Layout.build(self.pool, [r.blocks for r in reqs], [r.n_slots for r in reqs], k,
                           [r.num_computed for r in reqs], self.device, rotary=self.inv_freq is not None)
        lay.attention = self.attention
        self.pool.pos[lay.write] = lay.source
        if self.pool.rot is not None:  # the rotary position each key is written at: its slot
            self.pool.rot[lay.write] = lay.positions[0]
        ids = torch.tensor([t for r, n in zip(reqs, k, strict=True) for t in r.tokens(n)], dtype=torch.long)
        done = [i for i, (r, n) in enumerate(zip(reqs, k, strict=True)) if r.num_computed + n == r.seq_len]
        out = {}
        kw = dict(
            input_ids=ids[None].to(self.device), position_ids=lay.positions, use_cache=False,
            kvbench_pool=self.pool, kvbench_layout=lay,
        )
        if done:
            keep = lay.last[torch.tensor(done, device=self.device)]
            logits = self.model(**kw, logits_to_keep=keep).logits[0]  # (len(done), V)
            nxt = logits.argmax(-1).tolist()
            out = {reqs[i].rid: t for i, t in zip(done, nxt, strict=True)}
        else:  # prefill chunks only: no logits
            self.model.get_decoder()(**kw)
        return out

    @torch.inference_mode()
    def rerotate(self, req: Request) -> None:
        """After `req` lost blocks: every kept key of it, in every layer, afresh from its written copy, rotated
        from the slot it was written at to the logical slot it holds now (cache rotation, no compounding)."""
        slots = self.pool.slots(req.blocks, req.n_slots).to(self.device)  # (N,) in logical order
        delta = (torch.arange(len(slots), device=self.device) - self.pool.rot[slots])[None, :, None]  # (1, N, 1)
        self.pool.k[:, slots] = rotate(self.pool.k_src[:, slots], delta, self.inv_freq)  # (L, N, H, D)

    def evictor(self, req: Request, candidates: range, n: int) -> list[int]:
        """The n lowest-scored evictable blocks of `req` (its policy's pair scores, aggregated per block)."""
        slots = self.pool.slots(req.blocks, req.n_slots).to(self.device)  # (N,)
        L, _, H = self.pool.k.shape[:3]
        N = slots.shape[0]
        pos = self.pool.pos[slots][None, None, None, :].expand(L, 1, H, -1)  # (L, 1, H, N)
        last = torch.full((1, 1, 1, 1), req.num_computed - 1, device=self.device)
        sw = lw = keys = None
        if self.pool.track:
            sw = self.pool.sum_w[:, slots].transpose(1, 2)[:, None]  # (L, 1, H, N)
            lw = self.pool.last_w[:, slots].transpose(1, 2)[:, None]
        if self.policy.needs_keys:  # Knorm, KeyDiff: the request's cached keys, as stored (RoPE applied)
            keys = self.pool.k[:, slots].transpose(1, 2)[:, None]  # (L, 1, H, N, D)
        stats = ScoreStats(pos=pos, last=last, sum_w=sw, last_w=lw, keys=keys,
                           n=torch.full((1, 1, 1, 1), N, device=self.device),
                           layers=torch.arange(L, device=self.device)[:, None, None, None])
        scores = block_scores(self.policy, stats, self.pool.block_size, self.block_score).cpu()
        return choose_blocks(scores, candidates, n)
