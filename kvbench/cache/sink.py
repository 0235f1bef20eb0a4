"""Where one layer's attention puts what the policy reads (the statistics sink of kvbench.attention.static_step).

A `LayerSink` is one layer of one group for the current forward: `accumulate` adds the forward's attention
statistics (sum_w, last_w) to the group's per-slot tensors, `remember` keeps the newest queries (SnapKV's
observation window, kvbench.cache.query_window), `observe` hands the forward to the policy's own observe step
(kvbench.policies.needs: its row state updated in place, its per-pair statistics written at the new pairs' slots).
A windowed group (its layers keep their window, no policy compresses
them) collects nothing. The flags say what the layer wants, so attention computes nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.cache import query_window
from kvbench.policies.needs import Observation


@dataclass
class Observing:
    """A policy's observe step over a cache: the policy, each layer's attention module, the model's rotary embedding."""

    policy: object
    modules: list
    rotary: object = None


class LayerSink:
    def __init__(self, g, i: int, step, observer=None):
        self.g, self.i, self.step = g, i, step
        self.track = g.sum_w is not None  # attention statistics (scored policies, full-attention groups)
        self.queries = g.q is not None  # the newest queries (a policy's query window)
        self.observer = observer if g.sliding is None and not g.settled else None  # a policy's observe step (Observing)
        self.observes = self.observer is not None

    def accumulate(self, w_sum: torch.Tensor, w_last: torch.Tensor) -> None:
        """Add a forward's attention statistics (B, H_kv, N) of the layer (pads already excluded)."""
        g, i = self.g, self.i
        N = w_sum.shape[-1]
        g.sum_w[i][:, :, :N] += w_sum
        lw = g.last_w[i][:, :, :N]
        if self.step.all_real:  # every sample brought a query (always so while decoding)
            lw.copy_(w_last)
        else:  # samples with no token in this forward keep their newest query's row
            lw.copy_(torch.where(self.step.active[:, None, None], w_last, lw))

    def remember(self, query: torch.Tensor, scaling: float) -> None:
        """Keep the newest W real queries of the layer (query (B, H_q, T, D), RoPE applied) and the softmax scale."""
        g, i = self.g, self.i
        g.q[i] = query_window.remember(g.q[i], self.step.q_src, query)
        g.scale = scaling

    def observe(self, module, query: torch.Tensor, key, value, scaling: float, hidden: torch.Tensor | None) -> None:
        """The policy's observe step over this forward's new pairs (key/value: the layer's held pairs after the write)."""
        g, i, st = self.g, self.i, self.step
        policy, rotary = self.observer.policy, self.observer.rotary
        k, v = g.written(i, st, key, value)  # (B, H, T, D) the new pairs, as the cache holds them
        state = {n: x[i] for n, x in g.rows.items()}  # (B, *shape) views: updated in place
        obs = Observation(layer=g.layers[i], module=module, hidden=hidden, positions=st.positions.long(), real=st.real,
                          query=query, key=k, value=v, scaling=scaling, state=state, rotary=rotary)
        out = policy.observe(obs) or {}
        for name, x in out.items():  # (B, H, T) per new pair, into its slot (pads: the scratch slot)
            g.own[f"own:{name}"][i][st.b_idx, :, st.slot] = x.transpose(1, 2).float()
