"""The static engine's attention step: one forward over the evicting cache (kvbench.cache), as the object
transformers' attention function receives (`kvbench_step`, kvbench.attention.interface).

It carries what attention needs and nothing of the cache's internals: per layer, the forward's layout (`layout(l)`:
a `kvbench.cache.layout.Step`, its masks, write slots and key count) and a statistics sink (`sink(l)`: where the
attention statistics, the newest queries and a policy's own observations of the layer go; `track`/`queries`/
`observes` say what it wants), the backend and the query chunk of the statistics pass, and the timer. The cache
provides `layout` and `sink`; the engine builds the step once per batch (`KVCache.attention_step`).

Backends (`backend`, already resolved: kvbench.attention.backend_choice): sdpa / flash return the output only and the
statistics come from a separate chunked pass (timed as "attn_stats"); fused computes both from one set of
probabilities per chunk; eager is transformers' eager path on the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvbench.attention import eager, flash, fused, sdpa
from kvbench.attention import pair_weights as statistics
from kvbench.attention.interface import SCORE_CHUNK
from kvbench.attention.unsupported import AttentionError, UnsupportedBackend


@dataclass
class StaticStep:
    layout: Callable  # layer -> its group's Step this forward (kvbench.cache.layout.Step)
    sink: Callable  # layer -> its statistics sink (kvbench.cache.sink.LayerSink)
    backend: str = "sdpa"
    score_chunk: int = SCORE_CHUNK
    timer: Callable | None = None  # timer(section, devices): a context (kvbench.timing.SectionTimer)
    hidden_states: dict = field(default_factory=dict)  # layer -> its input hidden states (B, T, h), when declared

    def hidden(self, layer: int, states: torch.Tensor) -> None:
        """The attention module's input hidden states of this forward (kvbench.attention.interface's pre-hook)."""
        self.hidden_states[layer] = states

    def attend(self, module, query, key, value, scaling, kwargs) -> torch.Tensor:
        """query (B, Hq, T, D), key/value (B, H_kv, N, D): the layer's held pairs, this chunk's written.
        Returns the output (B, T, Hq, D)."""
        layer = module.layer_idx
        step = self.layout(layer)
        w = kwargs.get("sliding_window")
        if w != step.window and not (step.window is None and w is not None and step.longest <= w):
            # the model's own kind of attention against the cache's (a window longer than every sequence cuts nothing)
            raise AttentionError(f"layer {layer} attends with sliding_window={w}, kvbench's cache was built for "
                                 f"{step.window} (kvbench.models.family)")
        sinks, softcap = kwargs.get("s_aux"), kwargs.get("softcap")
        sink = self.sink(layer)
        backend, track = self.backend, sink.track
        if (sinks is not None or softcap is not None) and backend not in ("eager", "fused"):
            raise UnsupportedBackend(backend, f"layer {layer} has attention sinks or soft-capping")
        if sink.queries:  # the newest queries (SnapKV's observation window)
            sink.remember(query, scaling)
        if backend == "eager":  # output and statistics from one set of probabilities: no separate statistics time
            out, stats = eager.eager_attention(query, key, value, step, scaling, track, sinks, softcap)
        elif backend == "fused" and (track or sinks is not None or softcap is not None):
            out, stats = fused.fused_attention(query, key, value, step, scaling, self.score_chunk, track, sinks,
                                               softcap)
        else:
            kernel = flash.flash_attention if backend == "flash" else sdpa.sdpa_attention
            out = kernel(query, key, value, step, scaling).transpose(1, 2).contiguous()  # (B, T, Hq, D)
            stats = None
            if track:  # the separate statistics pass: timed as "attn_stats" (evict_s)
                with self.timer("attn_stats", (query.device,)):
                    stats = statistics.attention_stats(query, key, step, scaling, self.score_chunk)
        if stats is not None:
            sink.accumulate(*stats)
        if sink.observes:  # the policy's own statistics of the layer (Policy.observe)
            sink.observe(module, query, key, value, scaling, self.hidden_states.pop(layer, None))
        return out
