"""Scoring passes: a policy's extra forwards over token sequences built from a row's context (KVzip's reconstruction
passes), the attention step they run with, shared by the static engine (kvbench.engine.scoring_passes) and serve mode
(kvbench.serve.request_passes).

The policy (`needs.passes`) gives each row's passes (`Policy.scoring_passes(context ids)` -> `ScoringPass`es: the
ids fed and the context positions [start, end) the pass scores). Pass i of every row that has one runs in one
forward of the decoder, rows left-padded, at the positions after the row's context. Each layer's queries attend
to every pair the row holds and to the pass's own earlier pairs (the model's full causal attention, so later
layers see what the model computes); the pass's own K/V are the layer's transient, never written to the cache
(kvpress writes them to the cache and truncates after: the same keys, less memory). At each layer the policy's
`pass_scores(PassContext)` gives a (B, H_kv, N) statistic per held pair; the caller keeps the running max over
passes per (layer, row, head, pair), handed to the eviction as `ScoreContext.passed`. A policy whose passes need
gradients (`needs.pass_grad`, KVgrad) has each pass run with autograd (kvbench.attention.pass_grad) and its
`pass_scores` called per layer after the backward.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvbench.attention.interface import _hand_hidden, hook_attention
from kvbench.attention.pass_cache import pass_cache
from kvbench.attention.pass_grad import backward_pass
from kvbench.models.compat import cache_kwarg


@dataclass
class PassContext:
    """What a policy's `pass_scores` sees at one layer of one pass; B rows, T pass tokens (left-padded), N held.

    query:    (B, H_q, T, D) the pass's queries, RoPE applied
    keys:     (B, H_kv, N, D) the pairs the layer holds (slots >= n empty); values likewise
    own_keys: (B, H_kv, T, D) the pass's own keys (RoPE applied), pads included (see `real`)
    n:        (B,) pairs held per row; start, end: (B,) the context positions (= slots) the row's pass scores
              (start = end: the row has no pass this round)
    real:     (B, T) bool, the pass's real tokens
    hidden:   (B, T, h) the hidden states entering the layer's attention (after its input norm)
    module:   the layer's attention module (o_proj: KVzip+); scale: the softmax scale
    grad:     (B, T) float32 ||dPhi / d the layer's attention output|| per pass token (`needs.pass_grad` only,
              kvbench.attention.pass_grad); None otherwise
    """

    query: torch.Tensor
    keys: torch.Tensor
    values: torch.Tensor
    own_keys: torch.Tensor
    n: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    real: torch.Tensor
    scale: float
    layer: int
    module: object = None
    hidden: torch.Tensor | None = None
    grad: torch.Tensor | None = None


class PassStep:
    """The `kvbench_step` of one scoring pass: full attention over the held pairs + the pass's own, and the
    policy's per-pair statistic folded into `state` (layer -> (B, H_kv, N) running max). `held(layer)` gives the
    layer's pairs: (keys (B, H_kv, N, D), values, n (B,)), the static cache's or serve mode's pages.
    `deferred` (a pass with autograd): each layer's context is kept (its tensors detached, the held pairs read
    again) and scored by `finish(grads)` after the backward."""

    def __init__(self, held, policy, state: dict, start, end, real, deferred: bool = False):
        self.held, self.policy, self.state = held, policy, state
        self.start, self.end, self.real = start, end, real  # (B,), (B,), (B, T) on the model's device
        self.hidden_states: dict = {}
        self.pending: dict | None = {} if deferred else None  # layer -> PassContext without its held pairs

    def hidden(self, layer: int, states: torch.Tensor) -> None:
        self.hidden_states[layer] = states

    def attend(self, module, query, key, value, scaling, kwargs) -> torch.Tensor:
        """query (B, Hq, T, D), key/value (B, H_kv, T, D): the pass's own. Returns the output (B, T, Hq, D)."""
        layer = module.layer_idx
        held_k, held_v, n = self.held(layer)  # (B, H_kv, N, D), (B,)
        N = held_k.shape[2]
        n = n.to(query.device)
        T = query.shape[2]
        t = torch.arange(T, device=query.device)
        own = (t[None, :] <= t[:, None])[None] & self.real[:, None, :]  # (B, T, T) causal over real own keys
        held = (torch.arange(N, device=query.device)[None, :] < n[:, None])[:, None, :].expand(-1, T, -1)
        mask = torch.cat([held, own], dim=-1)[:, None]  # (B, 1, T, N + T)
        out = F.scaled_dot_product_attention(query, torch.cat([held_k, key], 2), torch.cat([held_v, value], 2),
                                             attn_mask=mask, scale=scaling, enable_gqa=True)
        hidden = self.hidden_states.pop(layer, None)
        ctx = PassContext(query=query.detach(), keys=held_k, values=held_v, own_keys=key.detach(), n=n,
                          start=self.start, end=self.end, real=self.real, scale=scaling, layer=layer, module=module,
                          hidden=None if hidden is None else hidden.detach())
        if self.pending is not None:
            self.pending[layer] = dataclasses.replace(ctx, keys=None, values=None)  # read again after the backward
        else:
            self.fold(ctx)
        return out.transpose(1, 2).contiguous()

    def fold(self, ctx: PassContext) -> None:
        """The policy's statistic of one layer's pass into the running max."""
        s = self.policy.pass_scores(ctx)  # (B, H_kv, N)
        N = s.shape[-1]
        prev = self.state.get(ctx.layer)
        if prev is not None and prev.shape[-1] < N:
            prev = F.pad(prev, (0, N - prev.shape[-1]))
        self.state[ctx.layer] = s if prev is None else torch.maximum(prev, s)

    def finish(self, grads: dict) -> None:
        """After a deferred pass's backward: each layer scored with its tokens' gradient norms (B, T), one layer's
        transient at a time."""
        for layer in list(self.pending):
            ctx = self.pending.pop(layer)
            k, v, _ = self.held(layer)
            self.fold(dataclasses.replace(ctx, keys=k, values=v, grad=grads[layer]))


def run_rows(model, held, policy, state: dict, per_row: list, seen: list[int], pad_id: int, linear=None) -> None:
    """Every round of passes (pass r of each row in one forward), the attention modules handing their input hidden
    states to the pass (KVzip+'s norm: the model's own activations, for the passes only). `linear`: a hybrid's
    linear-attention layers ({layer: LinearAttentionLayer} after the rows' contexts), read by every pass."""
    hooks = hook_attention(model, _hand_hidden)
    try:
        for r in range(max((len(p) for p in per_row), default=0)):
            one_pass(model, held, policy, state, [p[r] if r < len(p) else None for p in per_row], seen, pad_id,
                     linear)
    finally:
        for h in hooks:
            h.remove()


def one_pass(model, held, policy, state: dict, rows: list, seen: list[int], pad_id: int, linear=None) -> None:
    """One forward of the decoder over pass `rows` (a ScoringPass or None per row), left-padded; on a hybrid
    (`linear`) right-padded, its linear layers continuing from the contexts' states (kvbench.attention.pass_cache)."""
    T = max(len(p.ids) for p in rows if p is not None)
    B = len(rows)
    ids = torch.full((B, T), pad_id, dtype=torch.long, device="cpu")  # built on the host (a meta default device too)
    pos = torch.zeros((B, T), dtype=torch.long, device="cpu")
    real = torch.zeros((B, T), dtype=torch.bool, device="cpu")
    span = torch.zeros((2, B), dtype=torch.long, device="cpu")
    for b, p in enumerate(rows):
        if p is None:
            continue
        q = len(p.ids)
        cols = slice(0, q) if linear else slice(T - q, T)
        ids[b, cols] = torch.tensor(p.ids, dtype=torch.long, device="cpu")
        pos[b, cols] = torch.arange(seen[b], seen[b] + q, device="cpu")
        real[b, cols] = True
        span[:, b] = torch.tensor([p.start, p.end], device="cpu")
    dev = model.get_input_embeddings().weight.device
    span, real = span.to(dev), real.to(dev)
    step = PassStep(held, policy, state, span[0], span[1], real, deferred=policy.needs.pass_grad)
    decoder = model.get_decoder()
    cache = pass_cache(len(decoder.layers), linear, policy.needs.pass_grad)
    kw = {} if cache is None else {cache_kwarg(decoder): cache, "use_cache": True, "attention_mask": real.long()}
    if policy.needs.pass_grad:
        backward_pass(model, step, ids.to(dev), pos.to(dev), real, **kw)
    else:
        decoder(input_ids=ids.to(dev), position_ids=pos.to(dev), kvbench_step=step, **{"use_cache": False, **kw})
