"""KVgrad: KVzip's reconstruction weights times what a pair writes and how much the model's output depends on it
(KVgrad, OpenReview cg1wTCJjjk; kvpress 0.5.5's `KVgradPress`).

The passes are KVzip's (kvbench.policies.kvzip: the context after the template's prefix, in chunks of `chunk_size`
ids, each after a repeat prompt and the template's suffix), run with autograd (`needs.pass_grad`,
kvbench.attention.pass_grad): Phi = sum over a pass's tokens of ||h_L||^2 (the last decoder layer's output, before
the final norm, float32) is backpropagated. A chunk's pair c at layer l scores the largest, over the query heads
(h, g) of its KV group and the pass's tokens t, of A[h,g,t,c] x ||W_O^(h,g) v_c||_2 x ||dPhi / d a_t^l||_2: KVzip's
restricted softmax, the norm of the pair's value through o_proj's columns of that query head, the gradient norm
of the layer's attention output at t. The running max, sinks and eviction (global or per layer) are KVzip's.
Defined after prefill only (as KVzip). Cost: one forward + one backward per chunk, the pass's graph alive
until its backward (charged in the memory account).
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.policies.kvzip import KVzip
from kvbench.policies.kvzip_plus import value_out_norms
from kvbench.policies.policy import Needs


@dataclass
class KVgrad(KVzip):
    chunk_size: int = 512
    name: ClassVar[str] = "kvgrad"
    label: ClassVar[str] = "KVgrad"
    summary: ClassVar[str] = "KVzip's reconstruction attention x the value's output norm x the output's gradient"
    paper: ClassVar[tuple[str, str]] = ("KVgrad, 2026 (OpenReview)", "https://openreview.net/forum?id=cg1wTCJjjk")
    needs: ClassVar[Needs] = Needs(passes=True, pass_grad=True)

    def weigh(self, w: torch.Tensor, ctx, H: int, G: int) -> torch.Tensor:
        """w (B, H, G, T, N) x ||W_O^(h,g) v|| (model dtype, as kvpress) x the tokens' gradient norms (float32)."""
        w = w * value_out_norms(ctx.module.o_proj.weight, ctx.values, H, G)[:, :, :, None, :]
        return w * ctx.grad[:, None, None, :, None]

    def pass_scores(self, ctx) -> torch.Tensor:
        """KVzip's max, kept in the model's dtype as kvpress's table (a monotone rounding: the same max)."""
        return super().pass_scores(ctx).to(ctx.values.dtype)  # (B, H, N)
