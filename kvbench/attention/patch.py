"""kvbench's attention function, its registration with transformers, and the context that activates it.

`kvbench_attention` is registered with transformers' `AttentionInterface` under `NAME` (and a mask function
returning None under the same name: the mask is built from the cache, once per forward, by
`KVCache.begin_forward`). It is active only inside `kv_attention(model)`, on that model, never globally:
outside the context the model runs its own implementation.

The context also sets which backend and query chunk the attention function uses (`Active`, read on every
call). Both the model's implementation and that setting are put back on exit, normal or by an exception,
so nested or successive runs never inherit another run's backend. Registering the name is idempotent and
changes no model, so it is not undone.

The kernels and the statistics pass are looked up through their modules at call time (`sdpa.sdpa_attention`,
`stats.attention_stats`, ...), so a test or a benchmark that wraps one of them (tests/project/test_config_matrix.py's
Spy, scripts/bench_eviction.py's timers) sees every call.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface

from kvbench.attention import eager, flash, fused, sdpa
from kvbench.attention import stats as statistics
from kvbench.attention.select import resolve_backend

NAME = "kvbench"
SCORE_CHUNK = 64  # queries per chunk when computing attention weights for scores


@dataclass(frozen=True)
class Active:
    """What `kvbench_attention` runs: the resolved backend and the queries per chunk of the statistics."""

    backend: str = "sdpa"
    score_chunk: int = SCORE_CHUNK


_active = Active()  # set by kv_attention for the duration of its block, restored after


def active() -> Active:
    """The setting `kvbench_attention` uses now (the default outside every `kv_attention` block)."""
    return _active


def kvbench_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """AttentionInterface entry: query (B, Hq, T, D), key/value (B, H_kv, N, D) = the cache's kept pairs.

    Returns the output (B, T, Hq, D) and None (no weights: statistics go to the cache, `cache.accumulate`)."""
    cache = kwargs.get("kvbench_cache")
    if cache is None:  # called outside kvbench's engine: behave like SDPA
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    step = cache.step_for(module.layer_idx)  # its group's write plan and mask (groups differ with per-layer budgets)
    w = kwargs.get("sliding_window")
    if w != step.window and not (step.window is None and w is not None and int(cache.seen.max()) <= w):
        # the model's own kind of attention against the cache's (a window longer than every sequence cuts nothing)
        raise RuntimeError(f"layer {module.layer_idx} attends with sliding_window={w}, kvbench's cache was built "
                           f"for {step.window} (kvbench.models.family)")
    sinks, softcap = kwargs.get("s_aux"), kwargs.get("softcap")
    group = cache.group_of(module.layer_idx)  # windowed layers' groups collect no statistics, keep no queries
    now = _active
    backend, track = now.backend, cache.track_attention and group.sum_w is not None
    if (sinks is not None or softcap is not None) and backend not in ("eager", "fused"):
        raise RuntimeError(f"layer {module.layer_idx} has attention sinks or soft-capping: backend {backend} cannot run it")
    if cache.query_window and group.q is not None:  # the newest queries (SnapKV's observation window)
        cache.remember_queries(module.layer_idx, query, scaling)
    if backend == "eager":  # output and statistics from one set of probabilities: no separate statistics time
        out, stats = eager.eager_attention(query, key, value, step, scaling, track, sinks, softcap)
    elif backend == "fused" and (track or sinks is not None or softcap is not None):
        out, stats = fused.fused_attention(query, key, value, step, scaling, now.score_chunk, track, sinks, softcap)
    else:
        kernel = flash.flash_attention if backend == "flash" else sdpa.sdpa_attention
        out = kernel(query, key, value, step, scaling).transpose(1, 2).contiguous()  # (B, T, Hq, D)
        stats = None
        if track:  # the separate statistics pass: timed as "attn_stats" (evict_s)
            with cache.timer("attn_stats", (query.device,)):
                stats = statistics.attention_stats(query, key, step, scaling, now.score_chunk)
    if stats is not None:
        cache.accumulate(module.layer_idx, *stats)
    return out, None


def _no_mask(*args, **kwargs):
    return None  # kvbench_attention builds its own mask from the cache


def register() -> None:
    """Make the name "kvbench" known to transformers (idempotent; changes no model)."""
    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, kvbench_attention)
        AttentionMaskInterface.register(NAME, _no_mask)


@contextlib.contextmanager
def kv_attention(model, score_chunk: int = SCORE_CHUNK, backend: str = "auto", needs_attention: bool = False):
    """Run `model` with kvbench's attention inside the block; restore its implementation and `active()` after."""
    global _active
    register()
    previous_impl, previous = model.config._attn_implementation, _active
    _active = Active(backend=resolve_backend(backend, model, needs_attention), score_chunk=score_chunk)
    try:
        model.set_attn_implementation(NAME)
        try:
            yield model
        finally:
            model.set_attn_implementation(previous_impl or "sdpa")
    finally:
        _active = previous
