"""Eviction of one group of layers: select what to keep (pure), then gather it back in position order.

`select` ranks the pairs of every (layer, KV head, evicting sample) by the policy's score, the protected
ones (the first `protect_first` positions and each row's newest `recent` ones) first, and returns the
kept slots in position order; on equal scores the older pair goes first (stable sort). Rows may keep
different counts (per-sample budgets): the K = max best are taken and a row keeping k_b < K drops its
K - k_b lowest; its slots k_b .. K - 1 then receive copies past its count (never read, overwritten by the
next writes). `gather` compacts every per-slot tensor to those slots, K/V `gather_layers` layers at a
time; with re-rotation keys are rebuilt from their written copies (kvbench.cache.rotate).

A policy whose score is the position (`keeps_newest`: window, StreamingLLM, ED) keeps the sinks and the
newest pairs by slicing (`keep_newest`), with no score, sort or gather: the same pairs, less work.
"""

from __future__ import annotations

import torch

from kvbench.budgets import head_rule, knobs
from kvbench.cache import band, heads, rotate
from kvbench.cache.layout import to_device
from kvbench.policies.policy import Policy, ScoreContext

INF = float("inf")


def rank(score: torch.Tensor, pos: torch.Tensor, last: torch.Tensor, n: torch.Tensor, protect_first: int,
         recent: torch.Tensor) -> torch.Tensor:
    """The score as `select` ranks it (L, B', H, N) float: protected pairs (the first `protect_first` positions
    and each row's newest `recent` (B',)) +inf, empty slots (>= n (B',)) -inf."""
    N = pos.shape[-1]
    protected = (pos < protect_first) | (pos > last - recent[None, :, None, None])
    valid = torch.arange(N, device=pos.device) < n[None, :, None, None]
    return score.float().masked_fill(protected, INF).masked_fill(~valid, -INF)


def select(score: torch.Tensor, pos: torch.Tensor, last: torch.Tensor, n: torch.Tensor, keep: torch.Tensor,
           protect_first: int, recent: torch.Tensor, most: int | None = None, ragged: bool | None = None,
           ranked: bool = False) -> torch.Tensor:
    """Kept slots (L, B', H, K) in position order, K = keep.max().

    score, pos: (L, B', H, N); last: (1, B', 1, 1) last position processed; n, recent: (B',) pairs held,
    newest protected per row; keep: (B',) pairs to keep per row, or (L, B', H) per head (adaptive head
    budgets); all on the score's device. `most` (K) and `ragged` (rows keep different counts), known on the
    CPU, spare the two device syncs of reading them off `keep`. `ranked`: the score is `rank`'s already.
    """
    N, K = pos.shape[-1], int(keep.max()) if most is None else most
    if not ranked:
        score = rank(score, pos, last, n, protect_first, recent)
    # stable sort: ties keep position order, so the newer of equal pairs ranks higher
    order = torch.sort(score, dim=-1, stable=True).indices[..., N - K :]  # (L, B', H, K) the K best
    ragged = bool((keep != K).any()) if ragged is None else ragged
    if ragged:  # row b keeps its k_b best: the K - k_b lowest of the K go past the end, then clamp
        short = (K - keep)[None, :, None, None] if keep.dim() == 1 else (K - keep)[..., None]
        order = order.masked_fill(torch.arange(K, device=pos.device) < short, N)
    kept = torch.sort(order, dim=-1).values  # (L, B', H, K) slots in position order
    return kept.clamp_(max=N - 1) if ragged else kept


def gather(g, sel, kept: torch.Tensor, rows_of: dict[str, torch.Tensor], N: int, gather_layers: int,
           inv_freq: torch.Tensor | None, rows: torch.Tensor | None = None, keep: torch.Tensor | None = None) -> None:
    """Compact rows `sel` of every per-slot tensor of group `g` to the `kept` slots (L, B', H, K) of their N.

    rows_of: the (L, B', H, N) per-slot tensors of those rows (positions, statistics, written rotary
    positions), as the score read them; K/V are gathered `gather_layers` layers at a time. A quantized group
    (`g.store`) keeps its pairs itself: `rows` (B,) bool are the rows `sel` indexes, `keep` (B,) their counts.
    """
    K = kept.shape[-1]
    for name, x in rows_of.items():
        g.tensors()[name][:, sel, :, :K] = x.gather(-1, kept)
    if g.store is not None:  # kvbench.cache.qgroup: quantized pairs kept by the store's own rule
        g.keep(rows, kept, keep)
        return
    D = g.k.shape[-1]
    for l0 in range(0, len(g.layers), gather_layers):
        layers = slice(l0, min(l0 + gather_layers, len(g.layers)))
        idx = kept[layers, ..., None].expand(-1, -1, -1, -1, D)
        for x in (g.k, g.v) if g.k_src is None else (g.k_src, g.v):
            y = x[layers, sel, :, :N].gather(3, idx)  # (l, B', H, K, D)
            x[layers, sel, :, :K] = y
            del y  # not alive while the next tensor is gathered
        if g.k_src is not None:  # re-rotation: the keys afresh from their compacted written copies
            rotate.from_written(g, layers, sel, K, inv_freq)


def keep_newest(g, rows: torch.Tensor, keep: torch.Tensor, sinks: int, gather_layers: int) -> None:
    """Keep slots [0, sinks) and the newest `keep - sinks` slots of every row, by slicing.

    Rows that hold the same count c (and keep the same number) move slots [c - recent, c) to [sinks, keep)
    in one copy per tensor (K/V `gather_layers` layers at a time when source and target overlap).
    """
    pairs = torch.stack([g.n[rows], keep[rows]], dim=1)
    for c, k in torch.unique(pairs, dim=0).tolist():  # usually one (count, keep): all rows full; no device sync
        recent = k - sinks
        part = rows & (g.n == c) & (keep == k)
        every = bool(part.all())
        overlap = c - recent < k  # source and target slots overlap: copy through a temporary
        sel = slice(None) if every else to_device({"sel": part.nonzero()[:, 0]}, g.device)["sel"]
        for x in g.tensors().values():  # (L, B, H, C+1[, D])
            step = gather_layers if x.dim() == 5 else len(g.layers)
            for l0 in range(0, len(g.layers), step):
                src = x[l0 : l0 + step, sel, :, c - recent : c]  # a copy already when sel indexes rows
                x[l0 : l0 + step, sel, :, sinks:k] = src.clone() if every and overlap else src
        if g.store is not None:  # a quantized group: the same slots kept from its store
            slots = torch.cat([torch.arange(sinks), torch.arange(c - recent, c)]).to(g.device)
            g.keep(part, slots.expand(len(g.layers), int(part.sum()), g.pos.shape[2], k), keep)


def trim_windows(groups, r: torch.Tensor, gather_layers: int) -> None:
    """Before a forward bringing r (B,) tokens: a windowed group (`sliding` W) that could not hold them keeps, in
    the rows that need room, only its newest W - 1 pairs (all a query of this forward can still see)."""
    for g in groups:
        if g.sliding is None:
            continue
        rows = (g.n + r > g.capacity) & (r > 0)
        if bool(rows.any()):
            trim_window(g, rows, torch.full_like(g.n, g.sliding - 1), gather_layers)


def trim_window(g, rows: torch.Tensor, keep: torch.Tensor, gather_layers: int) -> None:
    """The rows (B,) bool of windowed group `g` keep their newest `keep` (B,) pairs (its window W - 1), by slicing."""
    keep_newest(g, rows, keep, 0, gather_layers)
    g.n = torch.where(rows, keep, g.n)


def evict(g, rows: torch.Tensor, keep: torch.Tensor, policy: Policy, *, seen: torch.Tensor, qpos: torch.Tensor,
          scale: float | None, inv_freq: torch.Tensor | None, gather_layers: int, observer=None) -> torch.Tensor | None:
    """Keep `keep` (B,) pairs of every (layer, head) of the rows (B,) bool of group `g`; counts updated. Under
    adaptive head budgets `keep` is each head's average and the heads' counts (L_g, B', H) are returned (CPU)."""
    n_rows, k_rows = g.n[rows], keep[rows]
    if bool((n_rows <= k_rows).any()):
        raise RuntimeError("evict called on a sample that does not hold more than `keep` pairs")
    if policy.keeps_newest and inv_freq is None:  # re-rotation moves keys: the generic path
        keep_newest(g, rows, keep, policy.protect_first, gather_layers)
    else:
        budget = keep + policy.evict_every if g.budget is None else g.budget  # (B,): what the rows may hold
        N, dev, every = int(n_rows.max()), g.device, bool(rows.all())
        h = to_device({  # every host index tensor of this eviction in one non-blocking copy (no device sync)
            "sel": None if every else rows.nonzero()[:, 0], "last": seen[rows] - 1, "n": n_rows, "keep": k_rows,
            "layers": torch.tensor(g.layers, device="cpu"), "recent": knobs.recent_pairs(policy, budget)[rows],
            "qpos": qpos[rows] if policy.needs.queries else None,
            "shift": k_rows - n_rows if g.q is not None and inv_freq is not None else None}, dev)
        sel = slice(None) if every else h["sel"]
        last = h["last"][None, :, None, None]
        t = {name: x[:, sel, :, :N] for name, x in g.tensors().items() if x.dim() == 4}  # (L, B', H, N) each
        stats = ScoreContext(
            pos=t["pos"], last=last, sum_w=t.get("sum_w"), last_w=t.get("last_w"),
            n=h["n"][None, :, None, None], layers=h["layers"][:, None, None, None],
            keys=g.held("k", rows, sel, N) if policy.needs.keys else None,
            values=g.held("v", rows, sel, N) if policy.needs.values else None,
            queries=g.q[:, sel] if policy.needs.queries else None,
            query_pos=h["qpos"][None, :, None, :] if policy.needs.queries else None,
            scale=scale, rotary=None if observer is None else observer.rotary,
            pair={k[4:]: x for k, x in t.items() if k.startswith("own:")} or None,
            state={k: x[:, sel] for k, x in g.rows.items()} or None,
            modules=None if observer is None else [observer.modules[layer] for layer in g.layers],
            passed=None if getattr(g, "passed", None) is None else g.passed[:, sel, :, :N],  # a scoring pass's (engine.passes)
        )
        uneven = head_rule(policy).needs_score
        ranked = rank(policy.score(stats), t["pos"], last, h["n"], policy.protect_first, h["recent"])
        if uneven and g.head_n is not None:  # heads that hold fewer pairs than the sample's count: not their holes
            ranked = heads.mask_holes(ranked, g, sel)
        if g.band:  # a compressed windowed group: what no later query sees goes first
            ranked = band.out_of_window(ranked, t["pos"], last, g.band)
        if uneven:  # a head rule that chooses the counts (AdaKV): each head its own, the layer's total the budget's
            c, host = heads.counts(ranked, h["keep"], policy)
            kept = select(ranked, t["pos"], last, h["n"], c, 0, h["recent"], most=int(host.max()), ragged=True,
                          ranked=True)
        else:
            kept = select(ranked, t["pos"], last, h["n"], h["keep"], 0, h["recent"], most=int(k_rows.max()),
                          ragged=bool((k_rows != k_rows.max()).any()), ranked=True)
        del ranked
        held = keep if not uneven else torch.where(rows, 0, keep).index_put((rows,), host.amax(dim=(0, 2)))
        g.passed = None  # a scoring pass's statistic serves one compression
        gather(g, sel, kept, t, N, gather_layers, inv_freq, rows, held)
        if h["shift"] is not None:  # kept queries follow the newest pairs
            rotate.queries_follow(g, sel, h["shift"][None, :, None, None], inv_freq)
        if uneven:
            g.n = heads.record(g, rows, sel, c, host, keep)
            return host
    g.n = torch.where(rows, keep, g.n)
    return None
