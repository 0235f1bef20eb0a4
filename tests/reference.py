"""Brute-force reference for the scored eviction policies of method.md, independent of kvbench's engine.

Plain and slow on purpose, for the tests only. Nothing from kvbench is imported: it has

* its own decoder forward over a transformers model's weights (Llama layout with q/k/v and
  gate/up projections, or Phi-3 with the fused `qkv_proj` and `gate_up_proj`): embedding, per layer
  RMSNorm, projections, RoPE at the pair's true position, attention, o_proj, MLP; final norm and
  lm_head. RMSNorm and the RoPE tables are computed in float32 and cast back exactly like
  transformers does, everything else in the model's dtype (float64 in the tests);
* ONE position processed at a time: a query attends to the pairs in its (layer, KV head)'s
  explicit cache, a Python list of `Pair` records (position, key, value, score bookkeeping), to
  which its own pair was just appended. Processing a block of Algorithm 1 token by token is the
  same computation, since nothing is evicted inside a block;
* its own score bookkeeping per pair: `sum_w` (weight received from every query so far) and
  `last_w` (weight from the newest query). With grouped-query attention each KV head's weights
  are the mean over the query heads of its group;
* its own eviction: per (layer, KV head), drop the lowest-scored unprotected pairs, ties going to
  the older pair, where the score is
      "average" (Batch-Max)  sum_w / (last + 1 - pos)
      "sum"     (H2O)        sum_w
      "vatp"    (VATP)       sum_w times the L1 norm of the pair's value
      "last"    (TOVA, per KV head)  last_w
      "last_layer" (TOVA)    last_w averaged over all query heads of the layer (the mean over the KV
                             heads of their group means; every head holds the same positions)
      "newest"  (window, StreamingLLM)  pos
      "knorm"                minus the key's L2 norm
      "keydiff"              minus the cosine of the key to the mean of the head's unit keys
      "chunkkv"              ChunkKV over SnapKV: whole chunks by the mean of SnapKV's head-summed score
      "critical"             CriticalKV over SnapKV: SnapKV's int(kv_size / 2) best first, the others by
                             (score + 1e-4) x the group mean of ||W_O^(hq) v||_1 (tests/reference_methods.py)
      "lagkv"                LagKV's rank of each pair in its partition (tests/reference_methods.py)
      "random"               a 31-bit integer hash of (seed, layer, head, last, pos), top 24 bits
      "snapkv"               per query head: the last `window` queries processed (kept in a
                             per-layer history, RoPE applied) attend, causally, over the pairs held;
                             their softmax rows averaged; the window's own pairs (positions from the
                             oldest window query on) left out (zeros) unless `pool_window`; then
                             max/avg-pooled over `kernel` neighbouring pairs (zero padding) and
                             averaged over the query heads of the group
  and protected pairs are positions < protect_first and the protect_recent newest positions;
* the schedules written from method.md:
      prefill_and_decode  Algorithm 1: first block of min(s, kv) positions, then "evict p, process
                          the next p positions" until the prompt is done; while decoding, evict p
                          whenever the cache holds kv pairs, then process the last token.
      decode_only         process the whole prompt; before each decode step, if the cache holds
                          kv pairs or more, evict down to kv - p. The first step compresses the
                          prompt at once; afterwards it is Algorithm 1's decode loop. This is
                          Algorithm 2 (extreme decoding) generalised: there kv - p = 1.
      after_prefill       process the whole prompt; before the first decode step, if the cache holds
                          more than kv pairs, evict down to exactly kv (kvpress's protocol); never
                          evict again.

Batch size 1 only: a left-padded batch of the engine is checked sample by sample against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from tests.reference_methods import lagkv as lagkv_scores


@dataclass
class Pair:
    """One cached key/value pair of one (layer, KV head)."""

    pos: int
    k: torch.Tensor  # (D,)
    v: torch.Tensor  # (D,)
    sum_w: float = 0.0  # weight received from every query processed so far (group mean)
    last_w: float = 0.0  # weight received from the newest query (group mean)


@dataclass(frozen=True)
class Spec:
    """A scored policy as method.md states it (not kvbench's Policy objects)."""

    rule: str  # "average" | "sum" | "last"
    kv_size: int
    evict_every: int
    schedule: str  # "prefill_and_decode" | "decode_only"
    protect_first: int = 0
    protect_recent: int = 0
    seed: int = 0  # random
    window: int = 0  # snapkv
    kernel: int = 7
    pooling: str = "max"
    layer_kv: tuple[int, ...] | None = None  # per-layer budgets (PyramidKV); None: kv_size in every layer
    pool_window: bool = False  # snapkv: pool over the window's own pairs too
    n_sink: int = 4  # lagkv
    lag: int = 128  # lagkv
    chunk: int = 0  # chunkkv: the chunk length (its inner score: snapkv's, with window, kernel, pooling)
    head_floor: float | None = None  # AdaKV (after_prefill): a layer's k x H pairs by score over its heads,
    # each head its int(k x head_floor) best first (kvpress's AdaKVPress); None: k pairs in every head


# kvbench's policy name -> the rule above that states it (tova: "last" for its per_kv_head variant); a new
# policy gets its rule written here, from its paper, not from its kvbench code; None: it never evicts
POLICY_RULES = {"full": None, "window": "newest", "streaming_llm": "newest", "extreme_decode": "newest",
                "batch_max": "average", "h2o": "sum", "tova": "last_layer", "knorm": "knorm", "keydiff": "keydiff",
                "random": "random", "snapkv": "snapkv", "pyramidkv": "snapkv",
                "vatp": "vatp", "lagkv": "lagkv", "chunkkv": "chunkkv", "critical": "critical",
                "kvzip": "kvzip", "kvzip_plus": "kvzip", "kvgrad": "kvzip",
                "expected_attention": "expected_attention", "kvzap": "kvzap", "duo_attention": "duo_attention",
                "compactor": "compactor"}
# a rule of tests/reference_generate.py's METHODS (compressed once after prefill): its parameters from the policy's
METHOD_PARAMS = {"kvzip": lambda p: dict(chunk=p.chunk_size, layerwise=p.head_budget == "layerwise"),
                 "kvzip_plus": lambda p: dict(chunk=p.chunk_size, layerwise=p.head_budget == "layerwise", plus=True),
                 "kvgrad": lambda p: dict(chunk=p.chunk_size, layerwise=p.head_budget == "layerwise", grad=True),
                 "duo_attention": lambda p: _tiny_duo(p),
                 "compactor": lambda p: dict(seed=p.seed, chunk=p.chunk_size, sink_start=p.sink_size_start,
                                             sink_end=p.sink_size_end)}
HIDDEN_RULES = {"expected_attention", "kvzap"}  # rules that read each layer's input hidden states (recorded while they run)


@dataclass
class Trace:
    tokens: list[int]
    # one entry per eviction: (positions processed so far, kept[layer][kv_head] = sorted positions)
    evictions: list[tuple[int, list[list[list[int]]]]] = field(default_factory=list)
    final: list[list[list[int]]] = field(default_factory=list)  # kept positions at the end
    peak: int = 0  # most pairs held by one (layer, head) at any time


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm: normalised in float32, cast back, then scaled."""
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class ReferenceModel:
    """The model's weights and a one-token forward over explicit per-(layer, KV head) caches."""

    def __init__(self, model):
        cfg = model.config
        sd = {k: v.detach() for k, v in model.state_dict().items()}
        self.dtype = sd["model.embed_tokens.weight"].dtype
        self.Hq = cfg.num_attention_heads
        self.Hkv = getattr(cfg, "num_key_value_heads", None) or self.Hq
        self.G = self.Hq // self.Hkv
        self.D = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.Hq
        self.eps = cfg.rms_norm_eps
        self.scale = self.D**-0.5
        self.hidden = None  # hidden[layer] = [(position, h (hidden,))] when set to a list per layer
        assert cfg.hidden_act == "silu", cfg.hidden_act
        rope = dict(getattr(cfg, "rope_parameters", None) or {})
        assert rope.get("rope_type", "default") == "default", rope
        base = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        rot = int(self.D * rope.get("partial_rotary_factor", 1.0))
        self.inv_freq = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))  # (rot/2,) float32
        self.embed = sd["model.embed_tokens.weight"]
        self.norm = sd["model.norm.weight"]
        self.lm_head = sd.get("lm_head.weight", self.embed)
        self.layers = []
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            w = {k[len(p) :]: v for k, v in sd.items() if k.startswith(p)}
            if "self_attn.qkv_proj.weight" in w:  # Phi-3: fused q|k|v, then gate|up
                q_end, k_end = self.Hq * self.D, (self.Hq + self.Hkv) * self.D
                qkv = w["self_attn.qkv_proj.weight"]
                wq, wk, wv = qkv[:q_end], qkv[q_end:k_end], qkv[k_end:]
                bq = bk = bv = None
                gate, up = w["mlp.gate_up_proj.weight"].chunk(2, dim=0)
            else:  # Llama
                wq, wk, wv = (w[f"self_attn.{n}_proj.weight"] for n in "qkv")
                bq, bk, bv = (w.get(f"self_attn.{n}_proj.bias") for n in "qkv")
                gate, up = w["mlp.gate_proj.weight"], w["mlp.up_proj.weight"]
            self.layers.append(
                dict(
                    ln1=w["input_layernorm.weight"], ln2=w["post_attention_layernorm.weight"],
                    wq=wq, wk=wk, wv=wv, bq=bq, bk=bk, bv=bv,
                    wo=w["self_attn.o_proj.weight"], bo=w.get("self_attn.o_proj.bias"),
                    gate=gate, up=up, down=w["mlp.down_proj.weight"],
                )
            )

    def new_cache(self) -> list[list[list[Pair]]]:
        """cache[layer][kv_head] = list of Pair, in position order."""
        return [[[] for _ in range(self.Hkv)] for _ in self.layers]

    def new_history(self) -> list[list[tuple[int, torch.Tensor]]]:
        """history[layer] = every (position, query (Hq, D) with RoPE) processed, oldest first."""
        return [[] for _ in self.layers]

    def _rope(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        """x (heads, D) rotated for position `pos` (tables in float32 like transformers)."""
        freqs = torch.tensor(float(pos), dtype=torch.float32) * self.inv_freq  # (rot/2,)
        emb = torch.cat((freqs, freqs))  # (rot,)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        rot = emb.shape[0]
        xr, xp = x[:, :rot], x[:, rot:]
        return torch.cat((xr * cos + _rotate_half(xr) * sin, xp), dim=-1)

    def step(self, token: int, pos: int, cache, history=None) -> torch.Tensor:
        """Process one token at `pos`: append its pairs, attend, update scores. Returns logits (V,)."""
        x = self.embed[token]  # (hidden,)
        for li, (lw, heads) in enumerate(zip(self.layers, cache, strict=True)):
            h = _rms_norm(x, lw["ln1"], self.eps)
            if self.hidden is not None:  # the hidden state entering the layer's attention (after its norm)
                self.hidden[li].append((pos, h.clone()))
            q = F.linear(h, lw["wq"], lw["bq"]).view(self.Hq, self.D)  # (Hq, D)
            k = F.linear(h, lw["wk"], lw["bk"]).view(self.Hkv, self.D)  # (Hkv, D)
            v = F.linear(h, lw["wv"], lw["bv"]).view(self.Hkv, self.D)
            q, k = self._rope(q, pos), self._rope(k, pos)
            if history is not None:
                history[li].append((pos, q.clone()))
            out = torch.zeros(self.Hq, self.D, dtype=self.dtype)
            for g in range(self.Hkv):
                pairs = heads[g]
                pairs.append(Pair(pos, k[g].clone(), v[g].clone()))
                K = torch.stack([pr.k for pr in pairs])  # (n, D)
                V = torch.stack([pr.v for pr in pairs])  # (n, D)
                group_w = torch.zeros(len(pairs), dtype=self.dtype)
                for j in range(self.G):
                    hq = g * self.G + j  # query heads of KV head g are consecutive (repeat_kv)
                    s = (K @ q[hq]) * self.scale  # (n,)
                    e = torch.exp(s - s.max())
                    w = e / e.sum()  # (n,)
                    out[hq] = w @ V
                    group_w += w
                group_w /= self.G
                for pr, wi in zip(pairs, group_w.tolist(), strict=True):
                    pr.sum_w += wi
                    pr.last_w = wi
            x = x + F.linear(out.reshape(-1), lw["wo"], lw["bo"])
            h = _rms_norm(x, lw["ln2"], self.eps)
            x = x + F.linear(F.silu(F.linear(h, lw["gate"])) * F.linear(h, lw["up"]), lw["down"])
        x = _rms_norm(x, self.norm, self.eps)
        return F.linear(x, self.lm_head)  # (V,)


M31 = 0x7FFFFFFF


def _mix(x: int) -> int:
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & M31
    x ^= x >> 12
    x = (x * 0x297A2D39) & M31
    return x ^ (x >> 15)


def random_score(seed: int, layer: int, head: int, last: int, pos: int) -> int:
    """The random rule's draw for one pair (an integer, so ties are exact)."""
    x = _mix(seed & M31)
    for v in (layer, head, last, pos):
        x = _mix((x + v) & M31)
    return x >> 7


def snapkv_scores(ref: ReferenceModel, pairs_per_head: list[list[Pair]], history, spec: Spec) -> list[list[float]]:
    """SnapKV's score of every pair of one layer, per KV head (lists in position order)."""
    window = history[-spec.window :]
    out = []
    for g, pairs in enumerate(pairs_per_head):
        per_q_head = []
        for j in range(ref.G):
            hq = g * ref.G + j
            acc = [0.0] * len(pairs)
            for qpos, q in window:
                seen = [i for i, pr in enumerate(pairs) if pr.pos <= qpos]
                if not seen:
                    continue
                logit = torch.stack([pairs[i].k @ q[hq] for i in seen]) * ref.scale
                w = torch.softmax(logit, dim=0).tolist()
                for i, wi in zip(seen, w, strict=True):
                    acc[i] += wi / len(window)  # the mean over the window's queries
            if not spec.pool_window:  # the window's own pairs are left out before pooling
                first = min(qpos for qpos, _ in window)
                acc = [0.0 if pr.pos >= first else a for pr, a in zip(pairs, acc, strict=True)]
            half, n = spec.kernel // 2, len(acc)
            pooled = []
            for i in range(n):
                hood = [acc[c] if 0 <= c < n else 0.0 for c in range(i - half, i + half + 1)]  # zero padding
                pooled.append(max(hood) if spec.pooling == "max" else sum(hood) / spec.kernel)
            per_q_head.append(pooled)
        out.append([sum(v[i] for v in per_q_head) / ref.G for i in range(len(pairs))])
    return out


def chunkkv_scores(ref, heads: list[list[Pair]], spec: Spec, last: int, history) -> list[list[float]]:
    """ChunkKV over SnapKV: SnapKV's scores, its window's pairs raised to the layer's largest score + 1 (kvpress's
    SnapKVPress); summed over the KV heads; a chunk (`spec.chunk` pairs from the first, the last partial) scores
    its pairs' mean, the newest chunk infinity; every pair its chunk's score. Shorter than a chunk: SnapKV's."""
    inner = snapkv_scores(ref, heads, history, spec)
    top = max(v for row in inner for v in row) + 1.0  # kvpress: F.pad(..., value=scores.max().item() + 1)
    inner = [[top if pr.pos > last - spec.window else v for pr, v in zip(pairs, row, strict=True)]
             for pairs, row in zip(heads, inner, strict=True)]
    n, c = len(heads[0]), spec.chunk
    if n < c:
        return inner
    summed = [sum(row[i] for row in inner) for i in range(n)]
    value = [sum(summed[j:j + c]) / len(summed[j:j + c]) for j in range(0, n, c)]
    value[-1] = float("inf")
    return [[value[i // c] for i in range(n)] for _ in heads]


def critical_scores(ref, layer: int, heads: list[list[Pair]], spec: Spec, last: int, history) -> list[list[float]]:
    """CriticalKV over SnapKV (kvpress's CriticalKVPress(SnapKVPress())): SnapKV's scores, its window's pairs
    raised to the layer's largest + 1; each head's int(kv_size x 0.5) best (at least 1; equal scores: the older) score
    the float32 maximum, the others (score + 1e-4) x the mean over the group of ||W_O^(hq) v||_1."""
    from tests.reference_methods import value_out_norm

    inner = snapkv_scores(ref, heads, history, spec)
    top = max(v for row in inner for v in row) + 1.0  # kvpress: F.pad(..., value=scores.max().item() + 1)
    inner = [[top if pr.pos > last - spec.window else v for pr, v in zip(pairs, row, strict=True)]
             for pairs, row in zip(heads, inner, strict=True)]
    big, first = float(torch.finfo(torch.float32).max), max(1, int(spec.kv_size * 0.5))
    out = []
    for g, (pairs, s) in enumerate(zip(heads, inner, strict=True)):
        best = set(sorted(range(len(s)), key=lambda i: -s[i])[:first])  # noqa: B023
        out.append([big if i in best else (s[i] + 1e-4) * sum(value_out_norm(ref, layer, g, pr.v, 1)) / ref.G
                    for i, pr in enumerate(pairs)])
    return out


def chunk_keep(n: int, spec: Spec) -> int:
    """ChunkKV's kept pairs for a prompt of n: the newest (maybe partial) chunk and the most whole chunks beside it
    that kv_size holds (all of them at kv_size >= n); shorter than a chunk: kv_size."""
    c = spec.chunk
    if n < c:
        return spec.kv_size
    chunks = -(-n // c)
    newest = n - (chunks - 1) * c
    return min(n, (max(0, spec.kv_size - newest) // c) * c + newest)


def layer_scores(ref, layer: int, heads: list[list[Pair]], spec: Spec, last: int, history) -> list[list[float]]:
    """The score of every pair of one layer, per KV head, under `spec.rule` (higher = keep)."""
    rule = spec.rule
    if rule == "snapkv":
        return snapkv_scores(ref, heads, history[layer], spec)
    if rule == "last_layer":  # every head holds the same positions: average the heads' rows per position
        positions = [pr.pos for pr in heads[0]]
        assert all([pr.pos for pr in pairs] == positions for pairs in heads), "heads hold different positions"
        mean = [sum(pairs[i].last_w for pairs in heads) / len(heads) for i in range(len(positions))]
        return [list(mean) for _ in heads]
    if rule == "keydiff":
        out = []
        for pairs in heads:
            unit = [pr.k / pr.k.norm() for pr in pairs]
            anchor = torch.stack(unit).mean(0)
            out.append([-float((u @ anchor / anchor.norm()).float()) for u in unit])  # float32, like knorm
        return out
    if rule == "chunkkv":
        return chunkkv_scores(ref, heads, spec, last, history[layer])
    if rule == "critical":
        return critical_scores(ref, layer, heads, spec, last, history[layer])
    if rule == "lagkv":  # kvpress's LagKVPress, as tests/reference_methods.py states it
        return lagkv_scores(ref, heads, spec.n_sink, spec.lag)
    if rule == "expected_attention":  # tests/reference_methods.py's rule over every hidden state seen so far
        from tests.reference_methods import expected_attention

        return expected_attention(ref, layer, heads, ref.hidden[layer])
    if rule == "kvzap":  # tests/reference_methods.py's rule with the random MLP scorer kvzap's tests use (seed 0)
        from tests.reference_methods import kvzap

        return kvzap(*_tiny_kvzap(ref), layer, heads, ref.hidden[layer])
    if rule == "random":
        return [[random_score(spec.seed, layer, g, last, pr.pos) for pr in pairs] for g, pairs in enumerate(heads)]
    return [[_score(pr, rule, last) for pr in pairs] for pairs in heads]


def _tiny_kvzap(ref) -> tuple[dict, dict]:
    """(config, weights) of the random KVzap scorer kvbench builds for a model with no name (its tiny ones)."""
    from types import SimpleNamespace

    from kvbench.artifacts.kvzap_scorer import tiny_scorer

    shape = SimpleNamespace(hidden_size=ref.layers[0]["wo"].shape[0], num_key_value_heads=ref.Hkv,
                            num_hidden_layers=len(ref.layers))
    s = tiny_scorer(shape, hidden_dim=8)
    return s.config(), {k: v.detach() for k, v in s.state_dict().items()}


def _tiny_duo(p) -> dict:
    """DuoAttention's inputs kvbench gives the tiny llama (a model with no name): head scores drawn uniform in [0, 1)
    from numpy's generator seeded 0, one per (layer, KV head), sink 2 and recent 10 unless the policy sets them."""
    import numpy as np

    from tests.conftest import _tiny

    cfg = _tiny("llama").model.config
    scores = np.random.default_rng(0).random((cfg.num_hidden_layers, cfg.num_key_value_heads)).tolist()
    return dict(head_scores=scores, sink=2 if p.sink_size is None else p.sink_size,
                recent=10 if p.recent_size is None else p.recent_size)


def _score(pr: Pair, rule: str, last: int) -> float:
    if rule == "newest":
        return pr.pos
    if rule == "knorm":  # float32 like the engine's scores: equal tokens give equal norms, a tie
        return -float(pr.k.norm().float())
    if rule == "average":
        return pr.sum_w / (last + 1 - pr.pos)  # queries that could attend the pair, its own included
    if rule == "sum":
        return pr.sum_w
    if rule == "vatp":  # the value's L1 norm in float32 like the engine's
        return pr.sum_w * float(pr.v.abs().sum().float())
    if rule == "last":
        return pr.last_w
    raise ValueError(rule)


def evict(cache, spec: Spec, keep, last: int, ref=None, history=None) -> None:
    """Per (layer, KV head): drop the lowest-scored unprotected pairs until `keep` remain (an int, or one
    per layer, None = leave the layer alone)."""
    for layer, heads in enumerate(cache):
        k = keep[layer] if isinstance(keep, list) else keep
        if k is None:
            continue
        scores = layer_scores(ref, layer, heads, spec, last, history)
        ks = [k] * len(heads) if spec.head_floor is None else adakv_counts(heads, scores, k, spec, last)
        for g, pairs in enumerate(heads):
            score = {id(pr): sc for pr, sc in zip(pairs, scores[g], strict=True)}
            drop = len(pairs) - ks[g]
            assert drop > 0 or (spec.head_floor is not None and drop == 0), (len(pairs), k)  # AdaKV: a head may keep all
            protected = lambda pr: pr.pos < spec.protect_first or pr.pos > last - spec.protect_recent  # noqa: E731
            candidates = [pr for pr in pairs if not protected(pr)]
            assert len(candidates) >= drop, "protections leave too few pairs to evict"
            # lowest score first; on equal scores the older pair (smaller position) goes first
            victims = sorted(candidates, key=lambda pr: (score[id(pr)], pr.pos))[:drop]  # noqa: B023
            gone = {id(pr) for pr in victims}
            heads[g] = [pr for pr in pairs if id(pr) not in gone]


def adakv_counts(heads: list[list[Pair]], scores: list[list[float]], k: int, spec: Spec, last: int) -> list[int]:
    """Pairs each KV head of one layer keeps under AdaKV, written from kvpress 0.5.5's AdaKVPress.compress:
    protected pairs rank first (kvpress's SnapKV window: the scores' max + 1), then each head's n_safe =
    int(k x alpha) best (topk, raised to the float max), then the H x k best of the flattened heads are kept."""
    big = float("inf")
    flat = []  # (score, head, pos) of every pair of the layer
    for g, pairs in enumerate(heads):
        ranked = [(big if pr.pos < spec.protect_first or pr.pos > last - spec.protect_recent else float(sc), pr.pos)
                  for pr, sc in zip(pairs, scores[g], strict=True)]
        safe = set(sorted(ranked, reverse=True)[: int(k * spec.head_floor)])  # the head's n_safe best
        flat += [(big if r in safe else r[0], g, r[1]) for r in ranked]
    chosen = sorted(flat, key=lambda x: (-x[0], -x[1], -x[2]))[: len(heads) * k]  # ties: the newer pair first
    return [sum(1 for _, g2, _ in chosen if g2 == g) for g in range(len(heads))]


def kept(cache) -> list[list[list[int]]]:
    return [[sorted(pr.pos for pr in pairs) for pairs in heads] for heads in cache]


def generate(ref: ReferenceModel, prompt: list[int], max_new: int, spec: Spec | None) -> Trace:
    """Greedy generation of `max_new` tokens (EOS ignored) under `spec` (None: full cache)."""
    hidden = spec is not None and spec.rule in HIDDEN_RULES
    if hidden:  # the hidden states entering each layer's attention, recorded while it runs
        ref.hidden = [[] for _ in ref.layers]
    try:
        return _generate(ref, prompt, max_new, spec)
    finally:
        if hidden:
            ref.hidden = None


def _generate(ref: ReferenceModel, prompt: list[int], max_new: int, spec: Spec | None) -> Trace:
    cache = ref.new_cache()
    history = ref.new_history()
    trace = Trace(tokens=[])
    size = lambda: len(cache[0][0])  # noqa: E731  every head holds the same count

    def process(tokens: list[int], start: int) -> torch.Tensor:
        logits = None
        for i, tok in enumerate(tokens):
            logits = ref.step(tok, start + i, cache, history)
            trace.peak = max(trace.peak, max(len(p) for heads in cache for p in heads))
        return logits

    def do_evict(keep: int, processed: int) -> None:
        evict(cache, spec, keep, processed - 1, ref, history)
        trace.evictions.append((processed, kept(cache)))

    s = len(prompt)
    if spec is not None and spec.layer_kv is not None:  # per-layer budgets: layer l by its own budget
        return _generate_per_layer(ref, prompt, max_new, spec, cache, trace, process, do_evict)
    if spec is None or spec.schedule in ("decode_only", "after_prefill"):
        logits = process(prompt, 0)
    elif spec.schedule == "prefill_and_decode":  # Algorithm 1
        kv, p = spec.kv_size, spec.evict_every
        t1 = min(s, kv)
        logits = process(prompt[:t1], 0)
        while t1 < s:
            do_evict(size() - p, t1)  # "evict p pairs"
            t0, t1 = t1, min(s, t1 + p)
            logits = process(prompt[t0:t1], t0)
    else:
        raise ValueError(spec.schedule)
    tok = int(logits.argmax())
    trace.tokens.append(tok)
    for t in range(1, max_new):
        if spec is not None:
            if spec.schedule == "after_prefill":
                budget = chunk_keep(s, spec) if spec.rule == "chunkkv" else spec.kv_size
                if t == 1 and size() > budget:  # the prompt compressed once, to its budget
                    do_evict(budget, s + t - 1)
            elif spec.schedule == "prefill_and_decode":
                assert size() <= spec.kv_size
                if size() == spec.kv_size:  # "if cache holds |kv| pairs: evict p pairs"
                    do_evict(spec.kv_size - spec.evict_every, s + t - 1)
            elif size() >= spec.kv_size:  # decode_only: compress the prompt once, then as above
                do_evict(spec.kv_size - spec.evict_every, s + t - 1)
        logits = process([tok], s + t - 1)
        tok = int(logits.argmax())
        trace.tokens.append(tok)
    trace.final = kept(cache)
    return trace


def _generate_per_layer(ref, prompt, max_new, spec, cache, trace, process, do_evict) -> Trace:
    """Algorithm 1 with a budget per layer k_l: the first block is the smallest budget, then blocks of p;
    before each block (or decode token) of r tokens, every layer with size + r > k_l evicts down to
    k_l - p (decode_only: from the first decode token on). The peak is checked per layer."""
    ks, p, s = list(spec.layer_kv), spec.evict_every, len(prompt)
    assert len(ks) == len(cache)

    def evict_before(r: int, processed: int, first_decode: bool = False) -> None:
        if spec.schedule == "after_prefill":  # only the first decode step, down to exactly k_l
            keep = [k if first_decode and len(cache[layer][0]) > k else None for layer, k in enumerate(ks)]
        else:
            keep = [k - p if len(cache[layer][0]) + r > k else None for layer, k in enumerate(ks)]
        if any(k is not None for k in keep):
            do_evict(keep, processed)

    def check() -> None:
        if spec.schedule == "prefill_and_decode":
            assert all(len(h) <= k for heads, k in zip(cache, ks, strict=True) for h in heads)

    if spec.schedule in ("decode_only", "after_prefill"):
        logits = process(prompt, 0)
    else:
        t1 = min(s, min(ks))
        logits = process(prompt[:t1], 0)
        check()
        while t1 < s:
            r = min(p, s - t1)
            evict_before(r, t1)
            logits = process(prompt[t1 : t1 + r], t1)
            t1 += r
            check()
    tok = int(logits.argmax())
    trace.tokens.append(tok)
    for t in range(1, max_new):
        evict_before(1, s + t - 1, first_decode=t == 1)
        logits = process([tok], s + t - 1)
        check()
        tok = int(logits.argmax())
        trace.tokens.append(tok)
    trace.final = kept(cache)
    return trace
