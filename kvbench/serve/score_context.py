"""What a policy's `score()` sees of one request in the paged pool: its pairs' statistics, per (layer, KV head).

`request_stats` gathers a request's held slots from the pool (positions, attention statistics, keys, values) and its
query window (SnapKV-like policies) into `ScoreContext` of one sample: one for every layer when all its
(layer, KV head)s hold the same count, else one per layer with each head's own count as `n` (so scores that
normalise over the held pairs, KeyDiff's mean key or SnapKV's softmax, see only what the head holds).
"""

from __future__ import annotations

import torch

from kvbench.policies.policy import Policy, ScoreContext


def request_stats(pool, windows, req, policy: Policy, device, observers=None, passed=None) -> list[ScoreContext]:
    """[ScoreContext (L, 1, H, N)] or, heads holding different counts, one (1, 1, H, N) per layer; `observers`: the
    policy's own state (kvbench.serve.observe), its modules and rotary embedding; `passed`: (L, 1, H, N) its scoring
    passes' statistic (kvbench.serve.request_passes)."""
    slots, valid = pool.slots(req.pages, req.held)
    slots = slots.to(device)
    L, H, N = slots.shape
    pos = pool.pos[slots][:, None]  # (L, 1, H, N)
    sw = lw = keys = values = queries = qpos = None
    if pool.track:
        sw, lw = pool.sum_w[slots][:, None], pool.last_w[slots][:, None]  # (L, 1, H, N)
    if policy.needs.keys:  # Knorm, KeyDiff, SnapKV: the request's cached keys, as stored (RoPE applied; dequantized)
        keys = pool.pairs(slots, "k")[:, None]  # (L, 1, H, N, D)
    if policy.needs.values:  # the request's cached values
        values = pool.pairs(slots, "v")[:, None]  # (L, 1, H, N, D)
    if windows is not None:
        queries, qpos = windows.get(req.rid)
    scale = windows.scale if windows is not None else None
    last = torch.full((1, 1, 1, 1), req.num_computed - 1, device=device)
    layers = torch.arange(L, device=device)[:, None, None, None]
    pair = {name: x[slots][:, None] for name, x in pool.own.items()} or None  # (L, 1, H, N) each
    state = mods = rotary = None
    if observers is not None:
        state = {name: x[:, None] for name, x in observers.state.get(req.rid, {}).items()} or None  # (L, 1, *shape)
        mods, rotary = observers.modules, observers.rotary
    if bool(valid.all()):
        return [ScoreContext(pos=pos, last=last, sum_w=sw, last_w=lw, keys=keys, values=values, queries=queries,
                             query_pos=qpos, scale=scale, n=torch.full((1, 1, 1, 1), N, device=device), layers=layers,
                             pair=pair, state=state, modules=mods, rotary=rotary, passed=passed)]
    held = req.held.to(device)
    return [ScoreContext(pos=pos[i:i + 1], last=last, sum_w=_at(sw, i), last_w=_at(lw, i), keys=_at(keys, i),
                         values=_at(values, i), queries=_at(queries, i), query_pos=qpos, scale=scale,
                         n=held[i][None, None, :, None], layers=layers[i:i + 1],
                         pair=None if pair is None else {k: _at(x, i) for k, x in pair.items()},
                         state=None if state is None else {k: _at(x, i) for k, x in state.items()},
                         modules=None if mods is None else mods[i:i + 1], rotary=rotary, passed=_at(passed, i))
            for i in range(L)]


def _at(t: torch.Tensor | None, i: int) -> torch.Tensor | None:
    """Layer i of a statistic (kept 4- or 5-dimensional), or None."""
    return None if t is None else t[i:i + 1]
