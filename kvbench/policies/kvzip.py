"""KVzip: each context pair scored by the largest attention it receives when the model reconstructs the context
(Kim et al., 2025, "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction"; kvpress 0.5.5's
`KVzipPress`).

After the prompt, the engine runs the policy's scoring passes (kvbench.attention.pass_step): the context after the chat
template's prefix, in chunks of `chunk_size` ids, each fed as `repeat prompt + template suffix + chunk`
(kvbench.artifacts.kvzip_template) at the positions after the context, against every held pair. At each layer a
chunk's pair scores the largest weight any query head of its KV group and any token of the pass gives it, in a
softmax restricted to the first min(n_sink, start) pairs, the chunk's pairs and the pass's own (causal); the
running max over passes is the score (0 for the template's prefix: it goes first), the first `n_sink` pairs kept.
Eviction: `head_budget=global` (kvpress's default: one ranking over the sample's whole layer x head table) or
`layerwise` (one per layer). Defined after prefill only: chunk-by-chunk eviction would reconstruct a context with
holes, and generated tokens have no context to repeat.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.artifacts import kvzip_template
from kvbench.budgets import is_int
from kvbench.errors import ConfigError
from kvbench.policies.policy import AFTER_PREFILL, Needs, Policy, ScoreContext


@dataclass
class KVzip(Policy):
    kv_size: int | None = 256
    schedule: str = AFTER_PREFILL
    head_budget: str = "global"
    n_sink: int = 4
    chunk_size: int = 2048
    name: ClassVar[str] = "kvzip"
    no_loglikelihood: ClassVar[str | None] = "its scoring passes run in generation only"
    label: ClassVar[str] = "KVzip"
    summary: ClassVar[str] = "largest attention a pair receives while the model repeats the context"
    paper: ClassVar[tuple[str, str]] = ("Kim et al., NeurIPS 2025", "https://arxiv.org/abs/2505.23416")
    published_schedule: ClassVar[str] = AFTER_PREFILL
    needs: ClassVar[Needs] = Needs(passes=True)

    def validate(self) -> None:
        if self.schedule != AFTER_PREFILL:
            raise ConfigError("policy.schedule", f"{self.name} scores each pair by reconstructing the whole context "
                              "once: defined after prefill only (use after_prefill)", self.schedule)
        if self.head_budget not in ("global", "layerwise"):
            raise ConfigError("policy.head_budget", f"{self.name} ranks its table globally or per layer: global or "
                              "layerwise", self.head_budget)
        if self.chunk_size <= 0:
            raise ConfigError("policy.chunk_size", "must be positive", self.chunk_size)
        if not is_int(self.n_sink) or self.n_sink < 0:
            raise ConfigError("policy.n_sink", "must be an integer >= 0", self.n_sink)
        super().validate()

    def prepare(self, tokenizer, model=None) -> None:
        """The chat template's prefix length and suffix ids (kvpress's split), and the tokenizer for the prompts."""
        self._tokenizer = tokenizer
        self._template = kvzip_template.template(tokenizer)

    def scoring_passes(self, context: list[int]) -> list:
        if getattr(self, "_template", None) is None:
            raise RuntimeError(f"{self.name}: call prepare(tokenizer) before generating (kvbench.engine.generate does)")
        prefix, suffix = self._template
        return kvzip_template.passes(self._tokenizer, context, self.chunk_size, 8, prefix, suffix)

    def pass_width(self, length: int) -> int:
        """The repeat prompt (+ the previous chunk's last 8 ids after the first), the suffix and a chunk; before
        `prepare`, 64 ids stand for the prompt and the suffix."""
        t = getattr(self, "_template", None)
        if t is None:
            return min(length, self.chunk_size) + 64
        encode = lambda text: len(self._tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
        ctx = max(length - t[0], 0)
        ask = encode(kvzip_template.FIRST) if ctx <= self.chunk_size else max(
            encode(kvzip_template.FIRST), encode(kvzip_template.NEXT) + 8)
        return ask + len(t[1]) + min(ctx, self.chunk_size)

    def pass_bytes(self, *, rows, kv_heads, q_heads, tokens, pairs, head_dim, elem) -> int:
        keys = rows * kv_heads * (pairs + tokens) * head_dim * elem  # the held and own keys concatenated
        weights = rows * q_heads * tokens * (pairs + tokens) * elem  # the logits, then their softmax
        return keys + 2 * weights + rows * tokens * (pairs + tokens) * 2  # + the masks

    def pass_scores(self, ctx) -> torch.Tensor:
        B, Hq, T, D = ctx.query.shape
        H, N = ctx.keys.shape[1], ctx.keys.shape[2]
        G = Hq // H
        keys = torch.cat([ctx.keys, ctx.own_keys], dim=2)  # (B, H, N + T, D)
        logits = torch.einsum("bhgtd,bhnd->bhgtn", ctx.query.view(B, H, G, T, D), keys) * ctx.scale
        slot = torch.arange(N, device=keys.device)[None]  # (1, N)
        chunk = (slot >= ctx.start[:, None]) & (slot < ctx.end[:, None])  # (B, N)
        held = (slot < ctx.start.clamp(max=self.n_sink)[:, None]) | chunk
        t = torch.arange(T, device=keys.device)
        own = (t[None, :] <= t[:, None])[None] & ctx.real[:, None, :]  # (B, T, T)
        mask = torch.cat([held[:, None, :].expand(-1, T, -1), own], dim=-1)  # (B, T, N + T)
        logits.masked_fill_(~mask[:, None, None], torch.finfo(logits.dtype).min)
        w = torch.softmax(logits, dim=-1)[..., :N]  # (B, H, G, T, N) model dtype, as kvpress
        del logits
        w = self.weigh(w, ctx, H, G)
        keep = chunk[:, None, None, None, :] & ctx.real[:, None, None, :, None]  # the chunk, real queries
        w = w.masked_fill(~keep, 0)  # (a pad's hidden state may be 0: KVzip+'s 1 / ||h|| is inf there)
        return w.amax(dim=(2, 3))  # (B, H, N)

    def weigh(self, w: torch.Tensor, ctx, H: int, G: int) -> torch.Tensor:
        """The weights as the score ranks them (KVzip+ normalises them)."""
        return w

    def score(self, ctx: ScoreContext) -> torch.Tensor:
        return ctx.passed.float().masked_fill(ctx.pos < self.n_sink, float("inf"))  # (L, B, H, N) the sinks kept
