"""The static engine's scoring passes (kvbench.attention.pass_step), run at the policy's compression point
(schedule=after_prefill: after the prompt, before the first decode step; query-agnostic runs: before the question),
over the cache's held pairs; the running max is left on each group of layers (`Group.passed`) for the eviction.
Timed as the "score_pass" section (the record's `score_pass_s`, inside `prefill_s`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvbench.attention.pass_step import run_rows


def run_passes(batch, policy, forward) -> None:
    """Run the policy's scoring passes over each row's context (what the cache has seen of its prompt) and leave
    the running statistic on each group of layers (`Group.passed`, (L_g, B, H_kv, N)) for the next eviction."""
    cache = batch.cache
    seen = cache.seen.tolist()
    per_row = [policy.scoring_passes(batch.prompts[b, :s].tolist()) for b, s in enumerate(seen)]
    state: dict = {}
    with cache.timer("score_pass", cache.devices):
        run_rows(forward.model, _cache_pairs(cache), policy, state, per_row, seen, batch.pad_id, cache.linear)
    for g in cache.groups:
        if g.sliding is None and g.layers and g.layers[0] in state:
            N = max(state[la].shape[-1] for la in g.layers)
            g.passed = torch.stack([F.pad(state[la], (0, N - state[la].shape[-1])) for la in g.layers])


def _cache_pairs(cache):
    """`held` over the static cache: each layer's slots up to the batch's most pairs held (a quantized group's
    read dequantized, as attention reads them: `Group.layer_pairs`)."""
    def held(layer: int):
        g, i = cache._where[layer]
        k, v = g.layer_pairs(i, int(g.n.max()))  # (B, H_kv, N, D) each
        return k, v, g.n
    return held
