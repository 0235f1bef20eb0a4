"""Compactor (Chari & Van Durme 2025, "Compactor: Calibrated Query-Agnostic KV Cache Compression with Approximate
Leverage Scores"; kvpress 0.5.5's CompactorPress): keep the pairs whose keys are geometric outliers (approximate
leverage scores) and the pairs a non-causal attention over the prompt favours, blended.

Over the prompt's middle (all but the first `sink_size_start` and the last `sink_size_end` pairs):
- leverage: the pre-RoPE keys (kvbench.models.prerope, from the layer's input hidden states) centred over the
  middle, times the layer's Gaussian sketch Phi (H_kv, D, `sketch_dimension`) / sqrt(dim) -> X (float32); the
  score of x_i is x_i^T (X^T X + jitter I)^-1 x_i >= 0 (Cholesky, jitter 1e-2, x10 while it fails);
- attention: the middle cut in chunks of `chunk_size` (the last padded with zero queries and keys); in a chunk
  every query (RoPE applied, the model's own) attends every key, unscaled, softmax in float32 (padded keys'
  logits -1e-9, padded queries' logits 0); a key's score is the sum of its weights over the chunk's queries,
  mean over the KV group, times ||v||, averaged with its two neighbours (zeros outside);
- each z-scored over the row's (KV head, middle pair) entries; score = blending x leverage + attention; the
  sinks score the row's largest. `blending` None: the compression ratio (kvpress's default; with kv_ratio:
  1 - kv_ratio; with kv_size: the share of the row's prompt the budget evicts).

The score is computed once, in the observe step of the prompt's forward (kvbench.policies.needs), and kept with
each pair (`pair_state`, 4 bytes per pair): the whole prompt must be ONE forward (`whole_prompt`), so schedules
that evict while running and gen.prefill_chunk are refused, and serve mode feeds the prompt in one step (kvbench.serve
.scheduler; a prompt longer than serve.max_tokens_per_step is refused). Forwards of one token
(decode steps) score 0 (never ranked: the prompt is compressed once). The sketch of layer l is the l-th draw of
shape (1, H_kv, D, dim) from `torch.Generator().manual_seed(seed)` (float32, cast to the keys' dtype): what
kvpress draws after `torch.manual_seed(seed)` at batch 1 on CPU; one sketch per layer, shared by the rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from kvbench.budgets import is_int
from kvbench.errors import ConfigError
from kvbench.models import prerope
from kvbench.policies.policy import AFTER_PREFILL, Needs, Policy, ScoreContext

_SKETCHES: dict = {}  # (seed, H, D, dim) -> (generator, [sketch of layer 0, 1, ...]), drawn in layer order


def sketch(seed: int, layer: int, H: int, D: int, dim: int) -> torch.Tensor:
    """(H, D, dim) float32 on the CPU: the layer-th draw of (1, H, D, dim) from a generator seeded `seed`."""
    g, drawn = _SKETCHES.setdefault((seed, H, D, dim), (torch.Generator().manual_seed(seed), []))
    while len(drawn) <= layer:
        drawn.append(torch.randn(1, H, D, dim, generator=g)[0])
    return drawn[layer]


def zscore(x: torch.Tensor, valid: torch.Tensor, ragged: bool) -> torch.Tensor:
    """x (B, H, M) float32 z-scored per row over its valid entries (valid (B, 1, M)); std with n - 1, >= 1e-6."""
    if not ragged:  # every row holds M: kvpress's reductions
        return (x - x.mean((1, 2), keepdim=True)) / x.std((1, 2), keepdim=True).clamp_min(1e-6)
    cnt = (valid.sum((1, 2), keepdim=True) * x.shape[1]).clamp(min=1)
    mean = x.masked_fill(~valid, 0).sum((1, 2), keepdim=True) / cnt
    var = ((x - mean) ** 2).masked_fill(~valid, 0).sum((1, 2), keepdim=True) / (cnt - 1).clamp(min=1)
    return (x - mean) / var.sqrt().clamp_min(1e-6)


def leverage(keys: torch.Tensor, valid: torch.Tensor, phi: torch.Tensor, ragged: bool) -> torch.Tensor:
    """keys (B, H, M, D) pre-RoPE, valid (B, 1, M), phi (H, D, k) in the keys' dtype: (B, H, M) float32 scores."""
    vk = valid[..., None]
    if ragged:
        mean = keys.masked_fill(~vk, 0).sum(-2, keepdim=True) / valid.sum(-1)[..., None, None].clamp(min=1)
    else:
        mean = keys.mean(-2, keepdim=True)
    X = torch.matmul(keys - mean, phi * (1 / math.sqrt(phi.shape[-1]))).to(torch.float32).masked_fill(~vk, 0)
    XT = X.transpose(-2, -1)  # (B, H, k, M)
    G = XT @ X
    G = 0.5 * (G + G.transpose(-2, -1))
    eye = torch.eye(G.shape[-1], dtype=G.dtype, device=G.device)
    jitter = torch.full((G.shape[0], 1, 1, 1), 1e-2, dtype=G.dtype, device=G.device)  # per row (kvpress: per call)
    for _ in range(5):
        L, info = torch.linalg.cholesky_ex(G + jitter * eye)
        bad = (info != 0).any(-1)  # (B,)
        if not bool(bad.any()):
            break
        jitter[bad] *= 10
    else:
        raise RuntimeError("compactor: Cholesky failed after 5 tries")
    return (X * torch.cholesky_solve(XT, L).transpose(-2, -1)).sum(-1).clamp_min(0)


def non_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor, chunk: int) -> torch.Tensor:
    """q (B, Hq, M, D) RoPE'd, k/v (B, H, M, D) as cached (zeros where not valid (B, 1, M)): (B, H, M) float32,
    the summed non-causal attention in chunks, group mean, x ||v||, pooled over 3 neighbours."""
    B, Hq, M, D = q.shape
    H = k.shape[1]
    S = -(-M // chunk) * chunk
    pad = (0, 0, 0, S - M)
    q, k = F.pad(q, pad).view(B, H, Hq // H, S, D), F.pad(k, pad)
    # padded keys' logits -1e-9, padded queries' 0: their vectors are zeros, so a bias on the keys does both
    bias = torch.zeros(B, 1, 1, S, dtype=q.dtype, device=q.device).masked_fill_(~F.pad(valid, (0, S - M))[:, None], -1e-9)
    A = torch.empty(B, H, S, dtype=torch.float32, device=q.device)
    for a in range(0, S, chunk):  # one chunk at a time: (B, Hq, C, C) logits alive
        z = a + chunk
        dots = q[:, :, :, a:z].reshape(B, H, -1, D) @ k[:, :, a:z].transpose(-1, -2)  # (B, H, G*C, C)
        dots += bias[..., a:z]
        A[:, :, a:z] = torch.softmax(dots.to(torch.float32), dim=-1).view(B, H, -1, chunk, chunk).sum(-2).mean(2)
    s = A[..., :M] * v.norm(dim=-1)  # (B, H, M)
    return F.avg_pool1d(s, kernel_size=3, padding=1, stride=1)


@dataclass
class Compactor(Policy):
    kv_size: int | None = 256
    schedule: str = AFTER_PREFILL
    sink_size_start: int = 8
    sink_size_end: int = 4
    chunk_size: int = 256
    sketch_dimension: int = 48
    blending: float | None = None  # None: the compression ratio (kvpress's default)
    seed: int = 0
    name: ClassVar[str] = "compactor"
    label: ClassVar[str] = "Compactor"
    summary: ClassVar[str] = ("approximate leverage scores of the pre-RoPE keys blended with a non-causal chunked "
                              "attention, computed once over the whole prompt")
    paper: ClassVar[tuple[str, str]] = ("Chari & Van Durme, 2025", "https://arxiv.org/abs/2507.08143")
    published_schedule: ClassVar[str] = AFTER_PREFILL
    gqa_note: ClassVar[str] = "the non-causal attention of a KV group's query heads is averaged (as kvpress)"
    no_loglikelihood: ClassVar[str | None] = "its observe step (scores of the prompt's forward) runs in generation only"
    after_prefill_only: ClassVar[str | None] = ("defines its chunks and z-scores on the whole prompt, and its "
                                                "non-causal attention needs the queries of pairs already evicted")
    whole_prompt: ClassVar[str | None] = ("its chunks and z-scores are defined on the whole prompt, scored in the "
                                          "prompt's one forward")
    needs: ClassVar[Needs] = Needs(hidden=True, module=True, pair_state=("score",))

    def validate(self) -> None:
        for key in ("sink_size_start", "sink_size_end"):
            if not is_int(getattr(self, key)) or getattr(self, key) < 0:
                raise ConfigError(f"policy.{key}", "must be an integer >= 0", getattr(self, key))
        for key in ("chunk_size", "sketch_dimension"):
            if not is_int(getattr(self, key)) or getattr(self, key) < 1:
                raise ConfigError(f"policy.{key}", "must be an integer >= 1", getattr(self, key))
        super().validate()

    def describe(self, gqa: bool = False, paged: bool = False) -> dict:
        d = super().describe(gqa, paged)
        if self.evicts:
            d["extensions"] += [
                f"sketch: layer l's is the l-th draw from torch.Generator().manual_seed({self.seed}), one per layer "
                "shared by a batch's rows (kvpress: torch's global generator, one per row)",
                "z-scores and the sinks' score per row (kvpress: over the whole batch)"]
            if self.blending is None and self.compression_ratio is None:
                d["extensions"].append("blending: " + ("1 - kv_ratio" if self.kv_ratio is not None else
                                       "the share of each row's prompt its kv_size evicts") +
                                       " (kvpress: the compression ratio)")
        return d

    def blend(self, n: torch.Tensor) -> torch.Tensor:
        """(B, 1, 1) the leverage's weight for rows of n (B,) prompt pairs."""
        if self.blending is not None or self.compression_ratio is not None or self.kv_ratio is not None:
            b = self.blending if self.blending is not None else self.compression_ratio if (
                self.compression_ratio is not None) else 1 - self.kv_ratio
            return torch.full((len(n), 1, 1), float(b), device=n.device)
        return (1 - self.kv_size / n.clamp(min=1).float()).clamp(min=0).view(-1, 1, 1)

    def observe(self, obs) -> dict:
        q = obs.query  # (B, Hq, T, D) RoPE applied
        B, Hq, T, D = q.shape
        H = obs.key.shape[1]
        if T == 1:  # a decode step: never ranked (the prompt is compressed once)
            return {"score": torch.zeros(B, H, T, dtype=torch.float32, device=q.device)}
        n = obs.real.sum(1)  # (B,) the rows' prompts (left-padded)
        left = n.clamp(max=self.sink_size_start)
        m = n - left - (n - left).clamp(max=self.sink_size_end)  # (B,) the middles
        ms = m.tolist()  # a sync, once per layer of a prompt's forward
        M, ragged = max(ms), min(ms) != max(ms)
        if M == 0:  # prompts of at most sink_size_start + sink_size_end pairs: nothing to rank
            return {"score": torch.zeros(B, H, T, dtype=torch.float32, device=q.device)}
        start = T - n + left  # (B,) each middle's first column
        j = torch.arange(M, device=q.device)
        valid = (j < m[:, None])[:, None]  # (B, 1, M)
        cols = (start[:, None] + j).clamp(max=T - 1)  # (B, M)
        take = lambda x: x.gather(2, cols[:, None, :, None].expand(-1, x.shape[1], -1, D)).masked_fill(  # noqa: E731
            ~valid[..., None], 0)
        hidden = obs.hidden.gather(1, cols[..., None].expand(-1, -1, obs.hidden.shape[-1]))  # (B, M, hidden)
        keys = prerope.keys(obs.module, hidden)  # (B, H, M, D)
        phi = sketch(self.seed, obs.layer, H, D, self.sketch_dimension).to(keys.device, keys.dtype)
        lev = zscore(leverage(keys, valid, phi, ragged), valid, ragged)
        del hidden, keys
        att = zscore(non_causal(take(q), take(obs.key), take(obs.value), valid, self.chunk_size), valid, ragged)
        s = self.blend(n) * lev + att  # (B, H, M)
        top = s.masked_fill(~valid, float("-inf")).amax((1, 2))  # (B,) the sinks' score
        top = torch.where(m > 0, top, 0.0)
        at = torch.arange(T, device=q.device) - start[:, None]  # (B, T) middle index of each column
        mid = (at >= 0) & (at < m[:, None])
        got = s.gather(2, at.clamp(0, M - 1)[:, None].expand(-1, H, -1))  # (B, H, T)
        return {"score": torch.where(mid[:, None], got, top[:, None, None])}

    def observe_bytes(self, *, rows, tokens, q_heads, kv_heads, head_dim, hidden, elem) -> int:
        if tokens == 1:
            return rows * kv_heads * 4
        H, C, k, e = kv_heads, self.chunk_size, self.sketch_dimension, elem
        S = -(-tokens // C) * C
        lev = tokens * (hidden * e + 3 * H * head_dim * e + H * k * (e + 16))  # keys, X, its float32 copies
        att = ((q_heads + 2 * H) * tokens * head_dim * e + (q_heads + H) * S * head_dim * e  # gathered, padded
               + q_heads * C * (head_dim * e + C * (e + 4 + (4 if e != 4 else 0))))  # one chunk's logits, softmax
        return rows * (4 * H * tokens * 4 + max(lev, att))

    def score(self, ctx: ScoreContext) -> torch.Tensor:
        return ctx.pair["score"]  # (L, B, H_kv, N), as the prompt's forward scored it
