"""kvbench's attention function and the context that activates it on one model.

`kvbench_attention` is registered with transformers' `AttentionInterface` (and a mask function
returning None under the same name: the mask is built from the cache, once per forward, by
`KVCache.begin_forward`). It is active only inside `kv_attention(model)`, on that model, never
globally: outside the context the model runs its own implementation.

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
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface

NAME = "kvbench"
SCORE_CHUNK = 64  # queries per chunk when computing attention weights for scores
BACKENDS = ("auto", "sdpa", "flash", "eager", "fused")
FLASH_CHECK_TOL = 2e-2  # max |flash - SDPA| - FLASH_CHECK_RTOL |SDPA| accepted on the first flash call of a process
FLASH_CHECK_RTOL = 1.6e-2  # 2 ulps of bfloat16 (torch.testing's bfloat16 rtol)
_state = {"score_chunk": SCORE_CHUNK, "backend": "sdpa", "flash_checked": False}


FLASH_DEVICES = {"cuda"}  # device types flash-attn runs on (tests add "cpu" with a stand-in kernel)
_flash_works: dict[str, bool] = {}  # device -> the probe's verdict, once per process


def _flash_probe(device: torch.device) -> bool:
    """flash-attn imports AND runs: one tiny `flash_attn_with_kvcache` call in float16 (a wheel built for another
    torch imports, or not, and fails at its first call: then kvbench falls back instead of failing mid-run)."""
    try:
        from flash_attn import flash_attn_with_kvcache

        q = torch.zeros(1, 1, 1, 64, dtype=torch.float16, device=device)
        kv = torch.zeros(1, 2, 1, 64, dtype=torch.float16, device=device)
        seqlens = torch.full((1,), 2, dtype=torch.int32, device=device)
        flash_attn_with_kvcache(q, kv, kv, cache_seqlens=seqlens, causal=True)
        return True
    except Exception:  # ImportError, an undefined symbol (OSError), a kernel error: all mean "not usable here"
        return False


def flash_available(device: str | torch.device = "cuda") -> bool:
    """flash-attn can run on `device` (a type or a device): a device type it supports, present, and working."""
    device = torch.device(device)
    if device.type not in FLASH_DEVICES or (device.type == "cuda" and not torch.cuda.is_available()):
        return False
    key = str(device)
    if key not in _flash_works:
        _flash_works[key] = _flash_probe(device)
    return _flash_works[key]


def resolve(backend: str, *, device_type: str, dtype: torch.dtype, needs_attention: bool, manual: bool = False) -> str:
    """The backend a run really uses (what its record and the memory account name).

    auto: on the CPU, `fused` for a policy that needs statistics (measured faster than SDPA + the
    statistics pass: README, Benchmarks); otherwise flash-attn when installed, on CUDA, in half
    precision, else SDPA (on CUDA, fused vs SDPA + statistics is not measured yet, so SDPA stays).
    `fused` for a policy that needs no statistics is SDPA (there is nothing to fuse).
    `manual`: the model's attention has sinks or soft-capping (no SDPA or flash kernel does both): `fused`
    unless `eager` was asked for.
    """
    if manual:
        return "eager" if backend == "eager" else "fused"
    if backend == "auto":
        if needs_attention and device_type == "cpu":
            return "fused"
        half = dtype in (torch.float16, torch.bfloat16)
        return "flash" if half and flash_available(device_type) else "sdpa"
    if backend == "fused" and not needs_attention:
        return "sdpa"
    return backend


def resolve_backend(backend: str, model, needs_attention: bool = False) -> str:
    """`resolve` for a loaded model."""
    from kvbench.models.family import kinds

    k = kinds(model.config)
    return resolve(backend, device_type=model.device.type, dtype=model.dtype, needs_attention=needs_attention,
                   manual=k.sinks or k.softcap is not None)


EXPAND_GQA_DEVICES = {"cuda"}  # device types whose SDPA has no fused kernel for GQA with a mask (tests may add cpu)


def _sdpa(query, key, value, step, scaling):
    """SDPA over the kept pairs. On CUDA, grouped-query attention with a mask has no fused kernel (flash takes no
    mask, the memory-efficient one no GQA): SDPA would fall back to its math kernel, which copies K/V per
    query head AND materialises the (B, Hq, T, N) probabilities. K/V are expanded here instead (2·B·Hq·N·D·e,
    what kvbench.memory charges), so the memory-efficient kernel runs with the mask."""
    gqa = query.shape[1] != key.shape[1]
    if gqa and step.mask is not None and query.device.type in EXPAND_GQA_DEVICES:
        groups = query.shape[1] // key.shape[1]
        key, value, gqa = _repeat_kv(key, groups), _repeat_kv(value, groups), False
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=step.mask, is_causal=step.causal, scale=scaling, enable_gqa=gqa,
    )  # (B, Hq, T, D)


def _flash(query, key, value, step, scaling):
    """flash-attn's kv-cache kernel on the cache's own storage (no copy).

    With causal=True it aligns each sample's mask bottom-right on its own `cache_seqlens`: query i
    sees slots <= n_b - T + i, which is exactly kvbench's mask since real queries are right-aligned
    in the chunk (pad rows may see nothing; flash returns zeros for them, they are discarded).
    The first call of a process is checked against SDPA (this path had no GPU to be tested on).
    """
    from flash_attn import flash_attn_with_kvcache  # the optional `flash` extra

    out = flash_attn_with_kvcache(
        query.transpose(1, 2),  # (B, T, Hq, D)
        key.transpose(1, 2),  # (B, N, H_kv, D), a strided view of the cache
        value.transpose(1, 2),
        cache_seqlens=step.seqlens,
        softmax_scale=scaling,
        causal=True,
        window_size=(-1, -1) if step.window is None else (step.window - 1, 0),  # the slots are consecutive positions
    ).transpose(1, 2)  # (B, Hq, T, D)
    if not _state["flash_checked"]:
        ref = _sdpa(query, key, value, step, scaling)
        real = step.real[:, None, :, None]  # compare real queries only
        # |diff| beyond a relative part (two kernels' roundings: bfloat16's ulp at 4.0 is 0.031)
        err = (((out - ref).abs() - FLASH_CHECK_RTOL * ref.abs()) * real).max().item()
        if not err <= FLASH_CHECK_TOL:
            raise RuntimeError(f"flash-attn disagrees with SDPA on kvbench's cache (max |diff| - {FLASH_CHECK_RTOL:g} "
                               f"|SDPA| = {err:.3g}); use gen.attention=sdpa")
        _state["flash_checked"] = True
    return out


def attention_stats(query, key, step, scaling: float, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention weights each cached pair received in this forward.

    query (B, Hq, T, D), key (B, H_kv, N, D). Returns (w_sum, w_last), both (B, H_kv, N) float32:
    w_sum sums the softmax rows of the real queries; w_last is the newest query's row. Query heads
    of a GQA group are averaged.

    Vectorised over batch, heads and the queries of a chunk, with one score buffer per chunk:
    the G query heads of a KV group and the chunk's queries are folded into one matrix, so a single
    batched matmul against the group's keys (no broadcast copy of the keys per query head) gives the
    (B, H_kv, G * tc, N) logits; masking runs in place on that buffer, then one fused softmax.
    Logits are computed in the model's dtype like eager attention, the softmax in float32. Peak extra
    memory per chunk, per (B, Hq, tc, N) element: 8 bytes for float32, float16 and bfloat16 models
    (float32 logits + weights; a half-precision matmul output is dropped once converted), 12 for
    float64 (its logits, their float32 copy, the weights), + O(B * Hq * chunk * D).
    """
    B, Hq, T, D = query.shape
    H, N = key.shape[1], key.shape[2]
    G = Hq // H
    acc = torch.float32  # softmax and sums; the statistics are stored in float32 anyway
    kt = key.transpose(-1, -2)  # (B, H, D, N), a view
    w_sum = torch.zeros(B, H, N, dtype=acc, device=query.device) if T > chunk else None
    w_last = None
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        tc = t1 - t0
        q = (query[:, :, t0:t1] * scaling).reshape(B, H, G * tc, D)  # (B, H, G*tc, D), heads of a group adjacent
        s = torch.matmul(q, kt)  # (B, H, G*tc, N)
        if s.dtype != acc:
            s = s.to(acc)
        s4 = s.view(B, H, G, tc, N)
        if step.mask is not None:
            s4.masked_fill_(~step.mask[:, :, None, t0:t1], float("-inf"))  # mask (B, 1, T, N)
        elif step.causal:
            qpos = torch.arange(t0, t1, device=query.device)[:, None]
            s4.masked_fill_(torch.arange(N, device=query.device)[None, :] > qpos, float("-inf"))
        s = torch.softmax(s, dim=-1)  # one fused kernel; slot 0 is never masked, so no row is empty
        s4 = s.view(B, H, G, tc, N)
        if t1 == T and T > 1:
            w_last = s4[:, :, :, -1].mean(dim=2)  # (B, H, N): the newest query's row, group mean
        if not step.all_real:
            s4.masked_fill_(~step.real[:, None, None, t0:t1, None], 0.0)  # pad queries give no weight
        if w_sum is None:  # a single chunk (always so while decoding)
            w_sum = s.sum(dim=2)  # (B, H, N)
        else:
            w_sum += s.sum(dim=2)
        del s, s4  # the next chunk's logits must not coexist with these weights
    if G > 1:
        w_sum /= G
    if w_last is None:  # one query: its row is the sum (for samples without a query, w_last is unused)
        w_last = w_sum
    return w_sum.float(), w_last.float()


def _keep_mask(step, T: int, N: int, device) -> torch.Tensor | None:
    """(B or 1, 1, T, N) bool: which keys each query may see; None when it sees all of them."""
    if step.mask is not None:
        return step.mask
    if step.causal:  # a first block of T == N real tokens per sample
        return torch.ones(T, N, dtype=torch.bool, device=device).tril(N - T)[None, None]
    return None


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """transformers' repeat_kv: (B, H_kv, N, D) -> (B, H_kv * groups, N, D), a copy when groups > 1."""
    if groups == 1:
        return x
    B, H, N, D = x.shape
    return x[:, :, None].expand(B, H, groups, N, D).reshape(B, H * groups, N, D)


def _stats_from_probs(p: torch.Tensor, step, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_sum, w_last), both (B, H_kv, N) float32, from probabilities p (B, Hq, T, N) (pad rows zeroed in place).

    p may be a (B, H_kv, G * T, N) folded view too: it is read as (B, H_kv, G, T, N).
    """
    B, N = p.shape[0], p.shape[-1]
    T = step.real.shape[1]
    p5 = p.reshape(B, kv_heads, -1, T, N)  # (B, H, G, T, N), a view
    if not step.all_real:  # pad queries give no weight (their outputs are discarded anyway)
        p5.masked_fill_(~step.real[:, None, None, :, None], 0.0)
    acc = torch.promote_types(p.dtype, torch.float32)
    w_sum = p5.sum(dim=3, dtype=acc).mean(dim=2)  # (B, H, N)
    w_last = p5[:, :, :, -1].mean(dim=2, dtype=acc) if T > 1 else w_sum  # the newest query's row
    return w_sum.float(), w_last.float()


def _eager(query, key, value, step, scaling, track: bool, sinks=None, softcap=None):
    """transformers' `eager_attention_forward` (models/llama/modeling_llama.py, 5.x) on kvbench's cache.

    query (B, Hq, T, D), key/value (B, H_kv, N, D). Returns the output (B, T, Hq, D) and, when `track`,
    the statistics from the very probabilities the output was computed with. Transient (per element
    of (B, Hq, T, N), e = model dtype bytes): the logits and their scaled copy (2e), the masked copy
    while the scaled one is alive (2e), softmax in float32 (+4 for its float32 copy of the input
    unless e = 4, +4 output), the cast back (e, the float32 weights still alive); plus repeat_kv's
    copies of K and V, 2 * B * Hq * N * D * e when Hq > H_kv.
    """
    B, Hq, T, _ = query.shape
    H, N = key.shape[1], key.shape[2]
    key_states = _repeat_kv(key, Hq // H)  # (B, Hq, N, D)
    value_states = _repeat_kv(value, Hq // H)
    w = torch.matmul(query, key_states.transpose(2, 3)) * scaling  # (B, Hq, T, N) model dtype
    if softcap is not None:  # Gemma 2's eager_attention_forward
        w = torch.tanh(w / softcap) * softcap
    keep = _keep_mask(step, T, N, query.device)
    if keep is not None:  # transformers adds a (B, 1, T, N) mask of 0 / dtype-min: the same values
        w = torch.where(keep, w, torch.finfo(w.dtype).min)
    if sinks is not None:  # gpt-oss's eager_attention_forward: the sink as one more logit, softmax in the model dtype
        w = torch.cat([w, sinks.reshape(1, -1, 1, 1).expand(B, -1, T, 1).to(w.dtype)], dim=-1)
        w = w - w.max(dim=-1, keepdim=True).values
        w = F.softmax(w, dim=-1, dtype=w.dtype)[..., :N].to(query.dtype)
    else:
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)  # (B, Hq, T, N)
    out = torch.matmul(w, value_states)  # (B, Hq, T, D)
    del key_states, value_states
    stats = _stats_from_probs(w, step, H) if track else None
    del w
    return out.transpose(1, 2).contiguous(), stats


def _fused(query, key, value, step, scaling, chunk: int, track: bool = True, sinks=None, softcap=None):
    """Output and statistics from one set of probabilities per chunk of `chunk` queries (no second pass).

    Like `attention_stats`, the G query heads of a KV group and the chunk's queries are folded into
    one (B, H_kv, G * tc, D) matrix (no copy of K or V per query head); logits in the model dtype,
    masked in place, softmax in float32 (float64 for float64 models), cast to the model dtype for the
    product with V. Returns the output (B, T, Hq, D) and (w_sum, w_last) (None unless `track`).
    `softcap`: tanh(logits / c) * c before the mask (Gemma 2); `sinks` (Hq,): one more logit per query head in
    every softmax, dropped after it (gpt-oss): its mass stays in the denominator of the weights and statistics.
    """
    B, Hq, T, D = query.shape
    H, N = key.shape[1], key.shape[2]
    G = Hq // H
    acc = torch.promote_types(query.dtype, torch.float32)
    kt = key.transpose(-1, -2)  # (B, H, D, N), a view
    out = torch.empty(B, T, Hq, D, dtype=query.dtype, device=query.device)  # what the layer wants
    keep = _keep_mask(step, T, N, query.device)
    w_sum = torch.zeros(B, H, N, dtype=acc, device=query.device) if track else None
    w_last = None
    sink = None if sinks is None else sinks.to(acc).view(1, H, G, 1, 1)
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        tc = t1 - t0
        q = (query[:, :, t0:t1] * scaling).reshape(B, H, G * tc, D)  # (B, H, G*tc, D), heads of a group adjacent
        s = torch.matmul(q, kt)  # (B, H, G*tc, N) model dtype
        del q
        if s.dtype != acc:
            s = s.to(acc)
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        if keep is not None:
            s.view(B, H, G, tc, N).masked_fill_(~keep[:, :, None, t0:t1], float("-inf"))
        if sink is None:
            p = torch.softmax(s, dim=-1)  # slot 0 is never masked, so no row is empty
        else:  # (B, H, G*tc, N + 1): the sink's logit last, dropped after the softmax
            s = torch.cat([s, sink.expand(B, H, G, tc, 1).reshape(B, H, G * tc, 1)], dim=-1)
            p = torch.softmax(s, dim=-1)[..., :N]
        del s
        pv = p if p.dtype == value.dtype else p.to(value.dtype)
        o = torch.matmul(pv, value)  # (B, H, G*tc, D)
        del pv
        out[:, t0:t1] = o.view(B, Hq, tc, D).transpose(1, 2)
        del o
        if not track:
            del p
            continue
        p5 = p.reshape(B, H, G, tc, N)
        if t1 == T and T > 1:
            w_last = p5[:, :, :, -1].mean(dim=2)  # (B, H, N): the newest query's row, group mean
        if not step.all_real:
            p5.masked_fill_(~step.real[:, None, None, t0:t1, None], 0.0)  # pad queries give no weight
        w_sum += p5.sum(dim=3).mean(dim=2)
        del p, p5
    if not track:
        return out, None
    if w_last is None:  # one query: its row is the sum
        w_last = w_sum
    return out, (w_sum.float(), w_last.float())


def kvbench_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """AttentionInterface entry: query (B, Hq, T, D), key/value (B, H_kv, N, D) = the cache's kept pairs."""
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
    backend, track = _state["backend"], cache.track_attention and group.sum_w is not None
    if (sinks is not None or softcap is not None) and backend not in ("eager", "fused"):
        raise RuntimeError(f"layer {module.layer_idx} has attention sinks or soft-capping: backend {backend} cannot run it")
    if cache.query_window and group.q is not None:  # the newest queries (SnapKV's observation window)
        cache.remember_queries(module.layer_idx, query, scaling)
    if backend == "eager":  # output and statistics from one set of probabilities: no separate statistics time
        out, stats = _eager(query, key, value, step, scaling, track, sinks, softcap)
    elif backend == "fused" and (track or sinks is not None or softcap is not None):
        out, stats = _fused(query, key, value, step, scaling, _state["score_chunk"], track, sinks, softcap)
    else:
        out = (_flash if backend == "flash" else _sdpa)(query, key, value, step, scaling)  # (B, Hq, T, D)
        out = out.transpose(1, 2).contiguous()
        stats = None
        if track:  # the separate statistics pass: timed as "attn_stats" (evict_s)
            with cache.timer("attn_stats", (query.device,)):
                stats = attention_stats(query, key, step, scaling, _state["score_chunk"])
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
    """Run `model` with kvbench's attention inside the block; restore its implementation after."""
    register()
    previous = model.config._attn_implementation
    _state["score_chunk"] = score_chunk
    _state["backend"] = resolve_backend(backend, model, needs_attention)
    model.set_attn_implementation(NAME)
    try:
        yield model
    finally:
        model.set_attn_implementation(previous or "sdpa")
