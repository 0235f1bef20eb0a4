"""ExpectedAttention (Devoto, Jeblick, Jégou 2025; kvpress's ExpectedAttentionPress): keep the pairs the FUTURE
queries are expected to attend to most.

The pre-RoPE queries a layer has processed (every real position >= n_sink, from its input hidden states through
q_proj (+ q_norm): kvbench.models.prerope) are modelled per query head as a Gaussian (mean mu, covariance Sigma).
The RoPE matrices of the next `n_future` positions (from the row's next one) are averaged, R = mean_t R_t (each
layer's own RoPE, kvbench.models.prerope.rotation: on partial-RoPE models only the rotary dims turn, the others pass
through, as the model leaves them; kvpress's rotate-half matrix where RoPE covers every dim), and rotate the statistics (mu' = R mu, Sigma' = R Sigma R^T). A held pair's expected logit is
mu'.k / sqrt(D) + k^T Sigma' k / (2 D) (the second term with `use_covariance`); softmax over the held pairs but
the first n_sink slots, mean over the query heads of the KV group, then (score + epsilon) x ||v|| (`use_vnorm`).
The first n_sink slots score the row's largest score + 1 (kept).

Statistics: the observe step (kvbench.policies.needs) accumulates, per (layer, row), the count, the mean (Hq, D)
and the centred scatter M2 (Hq, D, D) of the queries chunk by chunk, merged with Chan's parallel formula in
float32; Sigma = M2 / count (population covariance, as kvpress). After prefill (kvpress's protocol) that is
exactly the prompt's queries; under prefill_and_decode / decode_only, every query processed so far.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.budgets import is_int
from kvbench.errors import ConfigError
from kvbench.models import prerope
from kvbench.policies.policy import AFTER_PREFILL, Needs, Policy, ScoreContext

STATE = (("count", (1,)), ("mean", ("Hq", "D")), ("m2", ("Hq", "D", "D")))


@dataclass
class ExpectedAttention(Policy):
    kv_size: int | None = 256
    evict_every: int = 64
    schedule: str = AFTER_PREFILL
    n_future_positions: int = 512
    n_sink: int = 4
    use_covariance: bool = True
    use_vnorm: bool = True
    epsilon: float = 0.0
    name: ClassVar[str] = "expected_attention"
    no_loglikelihood: ClassVar[str | None] = "its observe step (query statistics) runs in generation only"
    label: ClassVar[str] = "ExpectedAttention"
    summary: ClassVar[str] = "expected attention of future queries (query mean/covariance, averaged RoPE) x value norm"
    paper: ClassVar[tuple[str, str]] = ("Devoto et al., 2025", "https://arxiv.org/abs/2510.00636")
    published_schedule: ClassVar[str] = AFTER_PREFILL
    gqa_note: ClassVar[str] = "the expected attention of a KV group's query heads is averaged (as kvpress)"
    needs: ClassVar[Needs] = Needs(keys=True, values=True, hidden=True, module=True, row_state=STATE)

    def validate(self) -> None:
        if not is_int(self.n_future_positions) or self.n_future_positions < 1:
            raise ConfigError("policy.n_future_positions", "must be an integer >= 1 (the future positions the "
                              "expected query is averaged over)", self.n_future_positions)
        if not is_int(self.n_sink) or self.n_sink < 0:
            raise ConfigError("policy.n_sink", "must be an integer >= 0", self.n_sink)
        super().validate()

    def describe(self, gqa: bool = False, paged: bool = False) -> dict:
        d = super().describe(gqa, paged)
        d["extensions"] += ["query statistics in float32, merged chunk by chunk (Chan's formula; kvpress: the model's "
                            "dtype, one prefill)", "sinks: each row's own largest score + 1 (kvpress: the batch's)",
                            "RoPE averaged as each layer applies it: partial RoPE (GLM-4, Phi-4-mini, Qwen3.5) rotates "
                            "its rotary dims and passes the others through, interleaved pairs (GLM-4, Cohere) and NoPE "
                            "layers as the model has them (kvpress: rotate-half over every dim, its only layout)"]
        return d

    def observe(self, obs) -> None:
        """Merge this forward's pre-RoPE queries (real positions >= n_sink) into the row's count, mean and M2."""
        q = prerope.queries(obs.module, obs.hidden).float()  # (B, Hq, T, D)
        w = (obs.real & (obs.positions >= self.n_sink)).float()[:, None, :, None]  # (B, 1, T, 1)
        nb = w.sum(2)[:, :, :, None]  # (B, 1, 1, 1)
        mb = (q * w).sum(2, keepdim=True) / nb.clamp(min=1)  # (B, Hq, 1, D)
        c = (q - mb) * w
        m2b = c.transpose(-1, -2) @ c  # (B, Hq, D, D)
        st = obs.state
        na = st["count"][:, :, None, None]  # (B, 1, 1, 1)
        n = na + nb
        delta = mb[:, :, 0] - st["mean"]  # (B, Hq, D)
        f = (nb / n.clamp(min=1))[:, :, 0]  # (B, 1, 1)
        st["m2"] += m2b + delta[..., :, None] * delta[..., None, :] * (na * f[..., None])
        st["mean"] += delta * f
        st["count"] += nb[:, :, 0, 0]
        return None

    def observe_bytes(self, *, rows, tokens, q_heads, kv_heads, head_dim, hidden, elem) -> int:
        return 4 * rows * q_heads * tokens * head_dim * 4 + 3 * rows * q_heads * head_dim * head_dim * 4

    def score(self, ctx: ScoreContext) -> torch.Tensor:
        L, B, H, N, D = ctx.keys.shape
        dev = ctx.keys.device
        t = (ctx.last[0, :, 0, :] + 1) + torch.arange(self.n_future_positions, device=dev)  # (B, F) future positions
        slot = torch.arange(N, device=dev)
        held = slot < ctx.n[0, :, :, :]  # (B, 1, N)
        out = torch.empty(L, B, H, N, dtype=torch.float32, device=dev)
        for layer in range(L):  # one layer at a time: (B, Hq, N, D) products per layer
            R = self.mean_rotation(ctx.rotary, ctx.modules[layer], t)  # (B, D, D)
            mean, count = ctx.state["mean"][layer], ctx.state["count"][layer].clamp(min=1)  # (B, Hq, D), (B, 1)
            mu = (R[:, None] @ mean[..., None])[..., 0]  # (B, Hq, D)
            k = ctx.keys[layer].float()  # (B, H, N, D)
            G = mu.shape[1] // H
            logit = (mu.view(B, H, G, D) @ k.transpose(-1, -2)) / D ** 0.5  # (B, H, G, N)
            if self.use_covariance:
                cov = R[:, None] @ (ctx.state["m2"][layer] / count[:, :, None, None]) @ R[:, None].transpose(-1, -2)
                kc = k[:, :, None] @ cov.view(B, H, G, D, D)  # (B, H, G, N, D)
                logit = logit + (kc * k[:, :, None]).sum(-1) / (2 * D)
            ok = held & (slot >= self.n_sink)
            p = logit.masked_fill(~ok[:, :, None], float("-inf")).softmax(-1).nan_to_num(0.0).mean(2)  # (B, H, N)
            if self.use_vnorm:
                p = (p + self.epsilon) * torch.linalg.vector_norm(ctx.values[layer].float(), dim=-1)
            top = p.masked_fill(~ok, float("-inf")).amax(dim=(1, 2), keepdim=True) + 1  # (B, 1, 1) the row's max + 1
            out[layer] = torch.where(slot < self.n_sink, top, p)
        return out

    @staticmethod
    def mean_rotation(rotary, module, t: torch.Tensor) -> torch.Tensor:
        """(B, D, D) the mean of the layer's RoPE matrices at positions t (B, F): kvpress's diag(cos) + diag(sin) P
        with the averaged cos/sin where RoPE covers every dim in rotate-half pairs, else the model's own layout
        (partial RoPE: the other dims pass through, as the layer leaves them; kvbench.models.prerope.rotation)."""
        cos, sin = prerope.cos_sin(rotary, t, torch.zeros(1, device=t.device, dtype=torch.float32), module)
        return prerope.rotation(module, cos.float().mean(1), sin.float().mean(1))

    def score_bytes(self, *, layers, rows, kv_heads, q_heads, pairs, head_dim, elem) -> int:
        G = q_heads // kv_heads
        return rows * (q_heads * pairs * (head_dim + 4) + 2 * kv_heads * pairs * head_dim + q_heads * head_dim ** 2) * 4 * (
            1 + G) // G
