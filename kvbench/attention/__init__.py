"""kvbench's attention on its own KV cache: backend choice, kernels, statistics, the step object every forward passes,
and the context that activates it.

Modules (one idea each; imports go down this list, never up):

* `select`: which backend a run uses (`resolve`, `resolve_backend`) and whether flash-attn runs here.
* `masks`: the boolean mask each query sees and GQA's K/V repetition, shared by the kernels.
* `stats`: attention statistics (the weight each cached pair received), for scored policies.
* `sdpa`, `flash`, `eager`, `fused`: the four kernels, one per backend (below).
* `errors`: the library's own errors (`AttentionError`, `UnsupportedBackend`); the config layer names the key.
* `interface`: the function registered with transformers, which hands each layer to the forward's step (the
  keyword `kvbench_step`), and `kv_attention(model)`, the context that switches a model to it and back.
* `static`: `StaticStep`, the static engine's step: the layout and statistics sink of the evicting cache, the
  backend and the query chunk (serve mode's step is kvbench.serve.paged_attention's `PagedStep`).

Backends (`gen.attention`):

* `sdpa`: the output from SDPA; when the policy needs attention statistics, the weights are
  recomputed separately (`attention_stats`), in chunks of queries, so the extra memory is
  O(B * H * chunk * N) and the output kernel stays fused.
* `flash`: flash-attn's kv-cache kernel (CUDA, half precision, the `flash` extra) + the same
  separate statistics pass.
* `eager`: the paper's conditions. transformers' `eager_attention_forward` on kvbench's cache: the
  (B, Hq, T, N) logits in the model dtype, masked, softmax upcast to float32 and cast back, times V,
  GQA by repeating K and V; one layer at a time and no query chunking, so the memory and speed are
  those of a 2024 Hugging Face implementation. The statistics come from those same probabilities.
* `fused`: output and statistics from ONE set of probabilities per chunk of `score_chunk` queries
  (no second softmax); policies that need no statistics run SDPA (there is nothing to fuse).
* `auto`: `fused` for scored policies on the CPU, else flash where it can run, else SDPA (`resolve`).

Every backend honours the layer's attention kind (kvbench.models.family): a sliding window is the
cache's band mask (flash: `window_size`); a layer with learned sinks (gpt-oss `s_aux`) or soft-capped
logits (Gemma 2 `softcap`) runs the `eager` path under `eager` and the `fused` one otherwise (SDPA has
neither; transformers itself runs those models eagerly), the sink's mass in every softmax's denominator,
scores included. A layer whose window differs from its cache group's raises: never a silent difference.

The public names are re-exported here; to wrap or replace a kernel or a setting, patch the module that defines it
(e.g. `kvbench.attention.sdpa.sdpa_attention`, `kvbench.attention.backend_choice.FLASH_DEVICES`): the dispatch reads them
there, not here.
"""

from __future__ import annotations

from kvbench.attention.backend_choice import BACKENDS, flash_available, resolve, resolve_backend
from kvbench.attention.flash import FLASH_CHECK_RTOL, FLASH_CHECK_TOL
from kvbench.attention.interface import (
    NAME,
    SCORE_CHUNK,
    attention_modules,
    kv_attention,
    kvbench_attention,
    register,
)
from kvbench.attention.pair_weights import attention_stats
from kvbench.attention.static_step import StaticStep
from kvbench.attention.unsupported import AttentionError, UnsupportedBackend

__all__ = [
    "BACKENDS", "FLASH_CHECK_RTOL", "FLASH_CHECK_TOL", "NAME", "SCORE_CHUNK", "AttentionError", "StaticStep",
    "UnsupportedBackend", "attention_modules", "attention_stats", "flash_available", "kv_attention",
    "kvbench_attention", "register", "resolve", "resolve_backend",
]
