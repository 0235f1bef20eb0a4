"""Memory budgets: the accounted peak of a batch, the CPU budget it is checked against, the CUDA cap.

`memory.budget_gb` (GiB, 2**30 bytes, per device) is a real cap on CUDA
(`torch.cuda.set_per_process_memory_fraction`: an out-of-memory is the allocator's own) and an
*accounted* budget on CPU: before a batch runs, `account` computes its peak and a batch over budget
raises `BudgetExceeded` (an `OutOfMemory`: the run is an "oom") before anything is allocated. On
CUDA the same figure is recorded next to `torch.cuda.max_memory_allocated`, so the model can be
checked against reality.

The account, per device, for a batch of B samples (e = bytes of the model dtype; h hidden size,
I MLP width, V vocabulary, Hq / H query / KV heads, D head dim, L layers on the device):

    peak = weights + KV cache + the largest transient
    weights     parameters and buffers as loaded (exact)
    KV cache    the preallocated cache, exact: `KVCache.nbytes_for` (K, V, positions, statistics), per
                group of layers (`kvbench.cache.form_groups`: per-layer budgets give each layer its own capacity;
                sliding-window layers hold W - 1 + the widest forward, their trims replayed like evictions)
    transient   the largest of
      forward of T tokens over N keys (every forward of the batch, replayed on counts, EOS ignored):
          4·B·T·h·e hidden states (embeddings output, layer input, residual, normed input)
        + 2·B·T·D·e RoPE cos/sin + B·T·N mask (bool) + B·(s + 4·T)·8 token ids and positions
        + the largest of: MLP 3·B·T·I·e (4 with Phi-3's fused gate_up);
                          RoPE 4·B·T·Hq·D·e (+ Phi-3's fused qkv output in every attention phase);
                          SDPA 2·B·T·Hq·D·e + B·T·N·e (mask as float) + kernel workspace (CPU: the
                          flash kernel's per-thread blocks; CUDA: the logsumexp B·Hq·T·4) + on CUDA
                          with GQA, K/V expanded per query head 2·B·Hq·N·D·e (no fused kernel takes
                          GQA and a mask; charged for every forward, masked or not: an upper bound);
                          scores (scored policies) 2·B·T·Hq·D·e + B·Hq·t·(N·a + D·e) + O(B·H·N),
                          a = max(4, e), t = min(T, 2·score_chunk) (a chunk's scores are computed
                          while the previous chunk's are alive);
                          (those two are `attention="sdpa"`, the default; "flash" drops the float
                          mask; the other backends replace both:)
                          eager B·T·Hq·D·e + repeat_kv 2·B·Hq·N·D·e (GQA) + S·c, S = B·Hq·T·N,
                          c = 8 (float32), 8 (half: logits and softmax's float32 output; the CPU kernel
                          and CUDA's float16 one upcast as they read; 10 for bfloat16 on CUDA, assumed
                          to copy its input to float32, not measured), 20 (float64);
                          or the output, its transposed copy and the query, 3·B·T·Hq·D·e;
                          fused 2·B·T·Hq·D·e + B·Hq·min(T, score_chunk)·N·2a + B·min(T, chunk)·N + O(B·H·N)
                          (models with sinks or soft-capping, which always run it: N + 1 keys, 3a);
                          logits B·V·e + B·T·h·e (logits_to_keep=1)
      eviction of b of the B rows over N pairs (+ the padded prompts B·s·8, alive between forwards):
          L·b·H·N·21 bytes (scores, sort values and int64
          indices, masks) + the K/V gather of `gather_layers` layers at a time: b = B gathers the
          kept pairs, gather_layers·B·H·keep·D·e; b < B first copies its rows out,
          gather_layers·b·H·(N + keep)·D·e + L·b·H·N·(4 + 8 if scored)
          + with policy.rerotate, the rotation of the kept keys from their written copies (`k_src`), in
          a = max(4, e) bytes: gather_layers·b·H·keep·(D·(4·a + (a if e < a) + e) + 8) (cos, sin, rotate_half,
          the product, the keys upcast, the result; the int64 angles' positions), + their copy when b < B,
          once the gathers are done (the larger of the two phases)
          + the keys' copy L·b·H·N·D·e for a policy that reads keys, and of its W kept queries
          L·b·Hq·W·D·e for a policy with a query window (b < B only)
          + the larger of (the scores, sort and gather above) and (the policy's own score computation,
          `Policy.score_bytes`, e.g. SnapKV's window logits, + its result)
      decode_only resize: the kv_size-slot cache, built while the prompt-sized one is alive
Per-sample budgets (kv_ratio) and per-layer ones (PyramidKV) are replayed group by group: a forward's
N is the largest group's, its masks are one per group (B·T·N_g each), an eviction of a group is charged
with that group's layers, and keep is the largest kept count of its rows (the gather's width).
Each device of a `device_map` split is charged the whole transient (an upper bound). Layers offloaded by
accelerate (their parameters on `meta`, in CPU RAM or on disk between forwards) are charged to the device
they compute on (their hook's execution device): their weights are no device's, and that device's
transient includes the largest offloaded layer's weights (brought in for its forward). Not counted:
Python objects, allocator fragmentation and caching, the CUDA context.
The terms follow the code paths kvbench runs (transformers' Llama / Phi-3 layers, kvbench's
attention and cache); tests/test_memory.py checks the account against the tensor bytes actually
allocated on CPU.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

import torch

from kvbench.attention import BACKENDS, resolve
from kvbench.budgets import adakv, rules
from kvbench.cache import KVCache, layer_capacities, layout
from kvbench.errors import ConfigError, OutOfMemory
from kvbench.models.family import effective_windows, kinds
from kvbench.models.geometry import layer_device
from kvbench.schedule import prefill_plan, rows_to_evict

GiB = 2**30
HIDDEN_BUFFERS = 4  # (B, T, h) tensors alive through a decoder layer
ID_BUFFERS = 4  # (B, T) int64 tensors of a forward's bookkeeping
ROPE_BUFFERS = 4  # query-sized tensors alive while RoPE rotates the queries
EVICT_BYTES = 21  # per (layer, sample, head, pair) in an eviction: score 4, sort values 4 + indices 8, masks
ROTATE_ACC = 4  # re-rotation: cos, sin, rotate_half and the product, per key element, in float32 (float64 models: float64)
GATHER_LAYERS = KVCache.__init__.__kwdefaults__["gather_layers"]  # the engine builds caches with the default


# --------------------------------------------------------------------------------------------- account
@dataclass(frozen=True)
class ModelShape:
    """The model numbers the account needs."""

    hidden: int
    intermediate: int
    vocab: int
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    mlp_buffers: int  # (B, T, I) tensors alive in the MLP
    fused_qkv: bool  # Phi-3: q, k, v are views of one projection, alive through the attention
    weights: dict[str, int]  # bytes per device
    layers: dict[str, int]  # decoder layers per device (where they compute: accelerate's execution device)
    windows: tuple = ()  # per decoder layer: its sliding window W, None for full attention (() : none windowed)
    manual: bool = False  # learned sinks or logit soft-capping: the fused (or eager) attention, never SDPA / flash
    layers: dict[str, int]  # decoder layers per device (where they compute: accelerate's execution device)
    onload: dict[str, int] = field(default_factory=dict)  # the largest offloaded layer's weights per device

    @property
    def elem(self) -> int:
        return torch.empty((), dtype=self.dtype, device="cpu").element_size()

    @classmethod
    def of(cls, model) -> ModelShape:
        cfg = model.config
        k = kinds(cfg)  # the family's adapter: heads, head size, windows (a refused family raises ConfigError)
        decoder_layers = model.get_decoder().layers
        weights: dict[str, int] = {}
        dispatched = getattr(model, "hf_device_map", None) is not None  # accelerate: meta = offloaded (CPU RAM, disk)
        for t in [*model.parameters(), *model.buffers()]:  # tied weights are yielded once
            if not (dispatched and t.device.type == "meta"):  # offloaded weights are no device's
                weights[str(t.device)] = weights.get(str(t.device), 0) + t.numel() * t.element_size()
        layers: dict[str, int] = {}
        onload: dict[str, int] = {}
        for layer in decoder_layers:
            d = str(layer_device(layer))
            layers[d] = layers.get(d, 0) + 1
            if dispatched and d != "meta":  # an offloaded layer's weights, on its device for its forward
                off = sum(p.numel() * p.element_size() for p in layer.parameters() if p.device.type == "meta")
                onload[d] = max(onload.get(d, 0), off)
        return cls(
            hidden=cfg.hidden_size,
            intermediate=cfg.intermediate_size,
            vocab=cfg.vocab_size,
            q_heads=k.q_heads,
            kv_heads=k.kv_heads,
            head_dim=k.head_dim,
            dtype=model.dtype,
            mlp_buffers=4 if hasattr(decoder_layers[0].mlp, "gate_up_proj") else 3,
            fused_qkv=hasattr(decoder_layers[0].self_attn, "qkv_proj"),
            weights=weights,
            layers=layers,
            windows=k.windows,
            manual=k.sinks or k.softcap is not None,
            onload={d: b for d, b in onload.items() if b},
        )


@dataclass(frozen=True)
class Footprint:
    """Accounted peak bytes of one batch on one device."""

    weights: int
    kv_cache: int
    transient: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.transient


@dataclass(frozen=True)
class Account:
    """Accounted peak of one batch, per device (keys like "cpu", "cuda:0")."""

    devices: dict[str, Footprint]

    @property
    def total(self) -> int:
        return sum(f.total for f in self.devices.values())

    def per_device(self) -> dict[str, int]:
        return {d: f.total for d, f in self.devices.items()}

    def describe(self, device: str) -> str:
        f = self.devices[device]
        return (
            f"{f.total / GiB:.3f} GiB (weights {f.weights / GiB:.3f} + KV cache {f.kv_cache / GiB:.3f}"
            f" + transient {f.transient / GiB:.3f})"
        )


def _cpu_sdpa_workspace(T: int, N: int, D: int, e: int) -> int:
    """Per-thread blocks of PyTorch's CPU flash-attention kernel (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp)."""
    q_split = min(T, 256 if T >= 768 else 64 if T >= 192 else 32)
    kv_split = min(N, 512)
    accum = q_split * kv_split + 2 * q_split + q_split * D  # float32 scores, max, sum, output accumulator
    reduced = q_split * kv_split * e if e < 4 else 0  # half types keep a copy of the scores
    return torch.get_num_threads() * (accum * 4 + reduced)


def _forward_bytes(
    s: ModelShape, B: int, T: int, N: int, longest: int, scored: bool, logits: bool, chunk: int, cpu: bool,
    attention: str = "sdpa", mask_keys: int | None = None,
) -> int:
    """Transient bytes of one forward over a (B, T) chunk that attends to N keys (`mask_keys`: the sum of
    every group's N, one mask each; default N)."""
    e, h, D, Hq = s.elem, s.hidden, s.head_dim, s.q_heads
    q = B * T * Hq * D * e  # one query-sized tensor
    ids = B * (longest + ID_BUFFERS * T) * 8  # the padded prompts, the chunk's ids, slots, positions
    base = ids + HIDDEN_BUFFERS * B * T * h * e + 2 * B * T * D * e + B * T * (N if mask_keys is None else mask_keys)
    qkv = B * T * (Hq + 2 * s.kv_heads) * D * e if s.fused_qkv else 0
    phases = [s.mlp_buffers * B * T * s.intermediate * e, qkv + ROPE_BUFFERS * q]
    stats = 3 * B * s.kv_heads * N * max(4, e)  # w_sum, w_last and a reduction of them
    if attention == "eager":  # kvbench.attention._eager: transformers' eager path, nothing chunked
        S = B * Hq * T * N  # elements of the (B, Hq, T, N) probabilities
        # softmax's float32 copy of its input: none in float32, none where the kernel upcasts as it reads
        # (CPU, measured for bfloat16; CUDA float16), a copy otherwise (CUDA bfloat16: not measured)
        conv = 0 if e == 4 or cpu or s.dtype == torch.float16 else 4
        probs = max(2 * e, e + conv + 4, (2 * e + 4) if e != 4 else 0) * S  # logits + scaled / masked / softmax / cast
        rep = 2 * B * Hq * N * D * e if Hq != s.kv_heads else 0  # repeat_kv's copies of K and V
        phases.append(qkv + q + rep + max(probs, S * e + q + (stats if scored else 0)))
        phases.append(qkv + 3 * q)  # the output, its transposed copy and the query
    elif attention == "fused":  # kvbench.attention._fused (scored policies; models with sinks or soft-capping)
        a = max(4, e)
        tc = min(T, chunk)
        # logits + probabilities (float32, one more column for a sink; soft-capping's tanh a third), the mask's inverse
        chunk_bytes = (B * Hq * tc * (N + 1) * 3 * a if s.manual else B * Hq * tc * N * 2 * a) + B * tc * N
        phases.append(qkv + 2 * q + chunk_bytes + (stats if scored else 0))
    else:
        workspace = _cpu_sdpa_workspace(T, N, D, e) if cpu else B * Hq * T * 4  # CUDA: the logsumexp
        mask = B * T * N * e if attention != "flash" else 0  # SDPA's float copy of the bool mask
        # CUDA SDPA, GQA with a mask: kvbench.attention._sdpa expands K/V per query head (no fused kernel has both)
        rep = 2 * B * Hq * N * D * e if not cpu and attention != "flash" and Hq != s.kv_heads else 0
        phases.append(qkv + 2 * q + mask + workspace + rep)
        if scored:  # kvbench.attention.attention_stats: one in-place score buffer per chunk of queries
            a = max(4, e)
            alive = min(T, 2 * chunk)  # queries whose scores are alive: a chunk's, while the last one's still are
            scores = B * Hq * alive * (N * a + D * e) + B * min(T, chunk) * N + stats
            phases.append(qkv + 2 * q + scores)
    if logits:
        phases.append(B * s.vocab * e + B * T * h * e)
    return base + max(phases)


def _evict_bytes(s: ModelShape, L: int, B: int, N: int, rows: int, keep: int, policy) -> int:
    """Transient bytes of one eviction of `rows` of the B samples, L layers, from N pairs down to `keep`."""
    scored = policy.needs_attention
    if rows == B:  # every row: the statistics are sliced in place and K/V gather only the kept pairs
        copies, gathered = 0, B * keep
    else:  # a subset: its positions (+ statistics) and its N pairs are copied out first
        copies, gathered = 4 + (8 if scored else 0), rows * (N + keep)
    gather = min(GATHER_LAYERS, L) * s.kv_heads * gathered * s.head_dim * s.elem  # gather_layers at a time
    if policy.rerotate:  # KVCache._rotate of the kept keys' written copies: cos, sin, rotate_half, product (acc dtype)
        e, a = s.elem, max(4, s.elem)
        per_key = s.head_dim * (ROTATE_ACC * a + (a if e < a else 0) + e + (e if rows < B else 0)) + 8
        gather = max(gather, min(GATHER_LAYERS, L) * s.kv_heads * rows * keep * per_key)  # after the gathers
    keys = L * rows * s.kv_heads * N * s.head_dim * s.elem if policy.needs_keys and rows < B else 0
    keys += L * rows * s.q_heads * policy.query_window * s.head_dim * s.elem if rows < B else 0  # kept queries
    own = policy.score_bytes(layers=L, rows=rows, kv_heads=s.kv_heads, q_heads=s.q_heads, pairs=N,
                             head_dim=s.head_dim, elem=s.elem)  # freed before the sort and the gather start
    pairs = L * rows * s.kv_heads * N
    heads = pairs * (8 + adakv.TRANSIENT_BYTES) if policy.head_budget == "adaptive" else 0  # AdaKV's counts
    return pairs * copies + keys + max(pairs * EVICT_BYTES + gather, pairs * 4 + own, heads)


def _trim_bytes(s: ModelShape, L: int, rows: int, keep: int) -> int:
    """Transient bytes of a windowed group's trim (`evict.keep_newest`): the newest `keep` slots of the rows,
    copied out `gather_layers` layers at a time (K, V) and for every layer at once (positions)."""
    return min(GATHER_LAYERS, L) * rows * s.kv_heads * keep * s.head_dim * s.elem + L * rows * s.kv_heads * keep * 4


def _cache_bytes(s: ModelShape, B: int, L: int, slots: int, policy, window: int | None = None) -> int:
    return KVCache.nbytes_for(
        batch_size=B, num_layers=L, num_kv_heads=s.kv_heads, head_dim=s.head_dim, capacity=slots, dtype=s.dtype,
        track_attention=policy.needs_attention, num_q_heads=s.q_heads, query_window=policy.query_window,
        rerotate=policy.rerotate and policy.evicts, window=window,
    )


def _walk(lengths: list[int], policy, max_new_tokens: int, prefill_chunk: int | None, groups: list[tuple],
          full_budgets: torch.Tensor | None, heads: int | None = None):
    """Replay the engine's schedule on counts only (EOS ignored: the worst case), group by group of layers.

    groups: `kvbench.cache.layout`'s list; full_budgets: the (L_full, B) budgets of the compressed layers. Returns the forwards {(width T, each group's keys N, makes logits)}
    and the evictions {(group index, keys N, rows, most kept)}.
    """
    B = len(lengths)
    plan = prefill_plan(lengths, policy, prefill_chunk, full_budgets)
    one = torch.ones(B, dtype=torch.long, device="cpu")
    steps = [(r, True, k == len(plan) - 1) for k, r in enumerate(plan)] + [(one, False, True)] * (max_new_tokens - 1)
    ns = [torch.zeros(B, dtype=torch.long, device="cpu") for _ in groups]  # pairs held per sample, per group
    forwards, evictions = set(), set()
    for i, (r, prefill, logits) in enumerate(steps):
        for gi, (_, _, cap, budget, window) in enumerate(groups):
            if window is not None:  # kvbench.cache.evict.trim_windows: keep the newest W - 1 pairs by slicing
                rows = (ns[gi] + r > cap) & (r > 0)
                if bool(rows.any()):
                    evictions.add((gi, int(ns[gi][rows].max()), int(rows.sum()), window - 1))
                    ns[gi] = torch.where(rows, window - 1, ns[gi])
                continue
            rows = rows_to_evict(ns[gi], r, policy, prefill, budget, first_decode=i == len(plan))
            if rows is not None:
                keep = torch.minimum(rules.head_slots(policy, policy.keep(budget), heads), ns[gi])  # the largest head
                evictions.add((gi, int(ns[gi][rows].max()), int(rows.sum()), int(keep[rows].max())))
                ns[gi] = torch.where(rows, keep, ns[gi])
        ns = [n + r for n in ns]
        forwards.add((int(r.max()), tuple(int(n.max()) for n in ns), logits))
    return forwards, evictions


def account(
    model_or_shape,
    lengths: list[int],
    policy,
    *,
    max_new_tokens: int,
    prefill_chunk: int | None = None,
    score_chunk: int = 64,
    attention: str = "sdpa",
) -> Account:
    """The accounted peak of one batch of prompts with these token `lengths` (module docstring).

    `attention`: the backend the batch runs with (sdpa | flash | eager | fused, or auto: resolved per
    device like `kvbench.attention.resolve`); its attention transient is charged.
    """
    s = model_or_shape if isinstance(model_or_shape, ModelShape) else ModelShape.of(model_or_shape)
    if attention not in BACKENDS:
        raise ValueError(f"attention must be one of {', '.join(BACKENDS)}: {attention!r}")
    B, longest = len(lengths), max(lengths)
    layer_devices = [dev for dev, L in s.layers.items() for _ in range(L)]
    windows = effective_windows(list(s.windows) or [None] * len(layer_devices), longest + max_new_tokens)
    budgets = policy.budgets(lengths, len(layer_devices))  # (L, B) or None
    full = [w is None for w in windows]
    full_budgets = None if budgets is None or not any(full) else budgets[full]
    widest = max(int(r.max()) for r in prefill_plan(lengths, policy, prefill_chunk, full_budgets))
    caps = layer_capacities(policy.capacities(lengths, max_new_tokens, budgets, s.kv_heads), windows, lengths, max_new_tokens,
                            widest)
    groups = layout(layer_devices, caps, budgets, windows)
    if budgets is None:  # the full cache: one row of "never" budgets
        groups = [(d, ls, c, torch.full((B,), c, dtype=torch.long, device="cpu"), w) for d, ls, c, _, w in groups]
    scored = policy.needs_attention
    forwards, evictions = _walk(lengths, policy, max_new_tokens, prefill_chunk, groups, full_budgets, s.kv_heads)
    devices = {}
    for dev in s.layers:
        mine = [gi for gi, g in enumerate(groups) if str(g[0]) == dev]
        backend = resolve(attention, device_type=dev.split(":")[0], dtype=s.dtype, needs_attention=scored,
                          manual=s.manual)
        transients = [  # the device's layers attend over their groups' keys; one mask per group lives on
            _forward_bytes(s, B, T, max(keys[gi] for gi in mine), longest, scored, logits, score_chunk, dev == "cpu",
                           backend, mask_keys=sum(keys[gi] for gi in mine))
            for T, keys, logits in forwards
        ]
        transients += [(_evict_bytes(s, len(groups[gi][1]), B, N, rows, keep, policy) if groups[gi][4] is None
                        else _trim_bytes(s, len(groups[gi][1]), rows, keep)) + B * longest * 8
                       for gi, N, rows, keep in evictions if gi in mine]  # + the padded prompts (int64), alive throughout
        for gi in mine:  # a compressed prompt: the smaller copy of a resize, built while the prompt-sized one lives
            _, layers, cap, row, window = groups[gi]
            if window is not None:
                continue
            need = policy.decode_capacity(int(row.max()), max_new_tokens, s.kv_heads)
            if policy.evicts and cap > need and any(e[0] == gi for e in evictions):
                transients.append(_cache_bytes(s, B, len(layers), need, policy))
        kv = sum(_cache_bytes(s, B, len(groups[gi][1]), groups[gi][2], policy, groups[gi][4]) for gi in mine)
        onload = s.onload.get(dev, 0)  # an offloaded layer's weights, brought here for its forward (accelerate)
        devices[dev] = Footprint(weights=s.weights.get(dev, 0), kv_cache=kv, transient=max(transients) + onload)
    for dev, w in s.weights.items():  # devices with weights but no decoder layer (e.g. the lm_head's)
        devices.setdefault(dev, Footprint(weights=w, kv_cache=0, transient=0))
    return Account(devices)


# --------------------------------------------------------------------------------------------- budget
class BudgetExceeded(OutOfMemory):
    """A batch's accounted peak is over the CPU budget (raised before anything is allocated)."""

    def __init__(self, message: str, account: Account):
        super().__init__(message, kind="accounted")
        self.account = account


class ModelDoesNotFit(ConfigError):
    """memory.budget_gb is below the model's own weights: bad input, not a measurement."""


@dataclass(frozen=True)
class Budget:
    """memory.budget_gb of a run, in bytes per device, less memory.reserve_gb (what the account cannot see)."""

    gb: float
    reserve_gb: float = 0.0

    @property
    def bytes(self) -> int:
        return int(self.gb * GiB)

    @property
    def usable(self) -> int:
        """Bytes per device the accounted peak may reach: the budget less the reserve."""
        return int((self.gb - self.reserve_gb) * GiB)

    def admit(self, acc: Account) -> None:
        """Raise BudgetExceeded if a CPU device's accounted peak is over budget (CUDA is capped for real)."""
        for dev, f in acc.devices.items():
            if dev == "cpu" and f.total > self.usable:
                reserve = f" less memory.reserve_gb={self.reserve_gb:g}" if self.reserve_gb else ""
                raise BudgetExceeded(
                    f"accounted peak {acc.describe(dev)} exceeds memory.budget_gb={self.gb:g}{reserve} on {dev}", acc
                )

    def check_weights(self, model) -> None:
        """Raise ModelDoesNotFit when the weights alone are over budget on some device."""
        for dev, w in ModelShape.of(model).weights.items():
            if w > self.usable:
                raise ModelDoesNotFit(
                    "memory.budget_gb",
                    f"the model alone does not fit: its weights take {w / GiB:.3f} GiB on {dev}",
                    self.gb,
                )


def budget_of(cfg) -> Budget | None:
    if cfg.memory.budget_gb is None:
        return None
    return Budget(float(cfg.memory.budget_gb), float(cfg.memory.get("reserve_gb") or 0.0))


def apply_cuda_cap(budget: Budget | None) -> None:
    """Cap every visible GPU at the budget less the reserve (fraction of its memory), or lift the cap.

    The reserve emulates what a smaller card loses outside PyTorch's allocator (its CUDA context)."""
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        total = torch.cuda.get_device_properties(i).total_memory
        torch.cuda.set_per_process_memory_fraction(1.0 if budget is None else min(1.0, budget.usable / total), i)


# --------------------------------------------------------------------------------------------- measurement
OOM_MESSAGES = (  # lower case; what a library says when an allocation inside it failed
    "out of memory",  # PyTorch's caching allocator, "CUDA error: out of memory"
    "can't allocate memory",  # the CPU allocator
    "cublas_status_alloc_failed",  # cuBLAS's workspace or handle (e.g. the first matmul of a new shape)
    "cudnn_status_alloc_failed",
    "cusolver_status_alloc_failed",
    "cufft_alloc_failed",
    "cudaerrormemoryallocation",
)


def is_oom(e: BaseException) -> bool:
    """A real or accounted out-of-memory (CUDA allocator, CUDA libraries' own allocations, CPU allocator,
    kvbench's account)."""
    text = str(e).lower()
    return isinstance(e, (OutOfMemory, torch.cuda.OutOfMemoryError)) or any(m in text for m in OOM_MESSAGES)


OOM_KINDS = ("accounted", "measured")


def oom_kind(e: BaseException) -> str:
    """How an out-of-memory was decided: "accounted" (the CPU budget's account: deterministic, final)
    or "measured" (an allocator, CUDA's or the CPU's, really ran out: may be transient)."""
    kind = getattr(e, "kind", None)
    return kind if kind in OOM_KINDS else "measured"


def cuda_devices(model) -> list[torch.device]:
    return sorted({p.device for p in model.parameters() if p.device.type == "cuda"}, key=str)


def reset_peaks(devices: list[torch.device]) -> None:
    for d in devices:
        torch.cuda.reset_peak_memory_stats(d)


def measured_peaks(devices: list[torch.device]) -> dict[str, int]:
    """torch.cuda.max_memory_allocated per device since the last `reset_peaks`."""
    return {str(d): torch.cuda.max_memory_allocated(d) for d in devices}


def reserved_peaks(devices: list[torch.device]) -> dict[str, int]:
    """torch.cuda.max_memory_reserved per device since the last `reset_peaks`: what the allocator held from
    CUDA (allocated + its cache and fragmentation), the figure the CUDA cap (`apply_cuda_cap`) limits."""
    return {str(d): torch.cuda.max_memory_reserved(d) for d in devices}


def release() -> None:
    """Free what no longer has a reference: Python cycles (gc), then the CUDA allocator's cache.

    kvbench itself leaves no cycle behind (a batch's cache is freed by reference counting when the batch
    ends); this is for the start of a trial or a run, so that its level does not include others' garbage.
    """
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def memory_level(devices: list[torch.device]) -> int:
    """Bytes a finished trial must have given back: allocated CUDA memory, or on CPU the live KV caches.

    On CPU the accounted budget refuses a batch before its cache exists, so the caches (the only
    large allocation that outlives a forward) are what an interrupted trial could leave behind; they are
    found through `KVCache.live()`, a weak registry. No `gc.collect()` here: a cache that only the
    cyclic collector could free is a leak, and must show.
    """
    if devices:
        return sum(torch.cuda.memory_allocated(d) for d in devices)
    return sum(c.allocated_bytes() for c in KVCache.live())
