"""Brute-force generation under the methods of tests/reference_methods.py, schedule after_prefill (kvpress's
protocol): the prompt processed token by token with every layer's hidden states recorded, each layer's cache
compressed once to what the method's rule keeps, then greedy decoding at the positions after the prompt (the
evicted pairs are gone; kept pairs keep their positions). What an engine's policy must reproduce, the way
tests/policies/test_scored.py uses tests/reference.py for the older policies.

METHODS maps a method to its rule: `rule(ctx, ratio, **params) -> kept[layer][kv_head]` (sorted indices into
the layer's cache), `ctx` the prefilled `Prefill`. Parameters are kvpress 0.5.5's defaults unless given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tests import reference_methods as M
from tests import reference_passes as P
from tests import reference_select as S


@dataclass
class Prefill:
    """The reference decoder after a prompt: its cache, each layer's hidden states, the prompt's ids and the
    tokenizer (KVzip's template), the logits of the prompt's last token."""

    ref: object
    ids: list[int]
    tok: object = None
    cache: list = field(default_factory=list)
    hidden: list = field(default_factory=list)
    logits: torch.Tensor | None = None


def prefill(ref, ids: list[int], tok=None) -> Prefill:
    ctx = Prefill(ref, list(ids), tok, ref.new_cache())
    ref.hidden = [[] for _ in ref.layers]
    for pos, t in enumerate(ids):
        ctx.logits = ref.step(t, pos, ctx.cache)
    ctx.hidden, ref.hidden = ref.hidden, None
    return ctx


def per_layer(ctx: Prefill, score, select) -> list[list[list[int]]]:
    return [select(score(layer)) for layer in range(len(ctx.cache))]


def sketches(ctx: Prefill, seed: int, dim: int = 48) -> list[torch.Tensor]:
    """Compactor's sketch: the layer-l draw of shape (1, H_kv, D, dim) from a generator seeded with `seed`
    (= kvpress after torch.manual_seed(seed))."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, ctx.ref.Hkv, ctx.ref.D, dim, generator=g)[0] for _ in ctx.cache]


def _ea(ctx, layer, **kw):
    return M.expected_attention(ctx.ref, layer, ctx.cache[layer], ctx.hidden[layer], **kw)


METHODS = {
    "expected_attention": lambda c, r, **kw: per_layer(c, lambda la: _ea(c, la, **kw), lambda s: S.topk(s, r)),
    "adakv_expected_attention": lambda c, r, alpha=0.2, epsilon=1e-2, **kw: per_layer(
        c, lambda la: _ea(c, la, epsilon=epsilon, **kw), lambda s: S.adakv(s, r, alpha)),
    "critical_expected_attention": lambda c, r, **kw: per_layer(
        c, lambda la: M.critical(c.ref, la, c.cache[la], _ea(c, la, use_vnorm=False), r, **kw),
        lambda s: S.topk(s, r)),
    "chunkkv_expected_attention": lambda c, r, chunk_length=20: per_layer(
        c, lambda la: _ea(c, la), lambda s: S.chunkkv(s, r, chunk_length)),
    "lagkv": lambda c, r, n_sink=4, lag=128: per_layer(
        c, lambda la: M.lagkv(c.ref, c.cache[la], n_sink, lag), lambda s: S.topk(s, r)),
    "compactor": lambda c, r, seed=0, chunk=256, sink_start=8, sink_end=4: (lambda sk: per_layer(
        c, lambda la: M.compactor(c.ref, la, c.cache[la], c.hidden[la], sk[la], r, sink_start, sink_end, chunk),
        lambda s: S.topk(s, r)))(sketches(c, seed)),
    "leverage": lambda c, r, seed=0: (lambda sk: per_layer(
        c, lambda la: M.leverage(c.ref, la, c.cache[la], c.hidden[la], sk[la]), lambda s: S.topk(s, r)))(
        sketches(c, seed)),
    "non_causal_attention": lambda c, r, chunk=256: per_layer(
        c, lambda la: M.non_causal_attention(c.ref, la, c.cache[la], c.hidden[la], chunk), lambda s: S.topk(s, r)),
    "adakv_kvzap": lambda c, r, cfg=None, sd=None, alpha=0.2: per_layer(
        c, lambda la: M.kvzap(cfg, sd, la, c.cache[la], c.hidden[la]), lambda s: S.adakv(s, r, alpha)),
    "kvzap": lambda c, r, cfg=None, sd=None: per_layer(
        c, lambda la: M.kvzap(cfg, sd, la, c.cache[la], c.hidden[la]), lambda s: S.topk(s, r)),
    # by threshold (DMS): `r` is the threshold
    "kvzap_dms": lambda c, r, cfg=None, sd=None, window=128: per_layer(
        c, lambda la: M.kvzap(cfg, sd, la, c.cache[la], c.hidden[la]), lambda s: S.dms(s, r, window)),
    "kvzip": lambda c, r, chunk=2048, layerwise=False, plus=False, grad=False: S.kvzip(
        P.kvzip_table(c.ref, c.cache, c.tok, c.ids, chunk=chunk, plus=plus, grad=grad), r, layerwise=layerwise),
    "kvzip_plus": lambda c, r, chunk=2048: METHODS["kvzip"](c, r, chunk=chunk, plus=True),
    "kvgrad": lambda c, r, chunk=512: METHODS["kvzip"](c, r, chunk=chunk, grad=True),
    # DuoAttention from a head pattern (L, H_kv) of scores: `r` is the share of streaming heads
    "duo_attention": lambda c, r, head_scores=None, sink=128, recent=256: [
        S.duo_kept(len(c.ids), row, sink, recent) for row in S.duo_streaming(head_scores, r)],
}


def compress(ctx: Prefill, kept: list[list[list[int]]]) -> None:
    """Each (layer, KV head) keeps the pairs at `kept` (indices into its list)."""
    for layer, heads in enumerate(ctx.cache):
        for g, pairs in enumerate(heads):
            heads[g] = [pairs[i] for i in kept[layer][g]]


def generate(ref, ids: list[int], max_new: int, method: str | None, ratio: float = 0.0, tok=None, keep=None,
             **params):
    """Greedy tokens (EOS ignored) and the kept indices after compressing the prompt once under `method`
    (None: the full cache). `keep`: compress to these kept indices instead of the rule's (e.g. kvpress's
    choice among tied scores)."""
    ctx = prefill(ref, ids, tok)
    kept = METHODS[method](ctx, ratio, **params) if method else None
    if keep or kept:
        compress(ctx, keep or kept)
    tokens = [int(ctx.logits.argmax())]
    for t in range(1, max_new):
        tokens.append(int(ref.step(tokens[-1], len(ids) + t - 1, ctx.cache).argmax()))
    return tokens, kept
