"""Where one layer's attention puts what the policy reads (the statistics sink of kvbench.attention.static).

A `LayerSink` is one layer of one group for the current forward: `accumulate` adds the forward's attention
statistics (sum_w, last_w) to the group's per-slot tensors, `remember` keeps the newest queries (SnapKV's
observation window, kvbench.cache.window). A windowed group (its layers keep their window, no policy compresses
them) collects nothing. The flags say what the layer wants, so attention computes nothing else.
"""

from __future__ import annotations

import torch

from kvbench.cache import window


class LayerSink:
    def __init__(self, g, i: int, step):
        self.g, self.i, self.step = g, i, step
        self.track = g.sum_w is not None  # attention statistics (scored policies, full-attention groups)
        self.queries = g.q is not None  # the newest queries (a policy's query window)
        self.observes = False

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
        g.q[i] = window.remember(g.q[i], self.step.q_src, query)
        g.scale = scaling
