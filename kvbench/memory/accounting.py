"""The accounted peak of a batch: fold the plan the engine executes, charge the largest term per device.

Pure: a `ModelShape`, the prompts' lengths, a policy and the generation settings in; an `Account` out.
Nothing is allocated and no model is needed, so the same account admits a batch before it runs
(`kvbench.memory.limit`), predicts the batch-size search and plans capacity without weights.

The account, per device, for a batch of B samples (e = bytes of the model dtype; h hidden size,
I MLP width, V vocabulary, Hq / H query / KV heads, D head dim, L layers on the device):

    peak = weights + KV cache + the largest transient
    weights     parameters and buffers as loaded (exact), + the policy's own for the device's layers
                (`Policy.weight_bytes`: KVzap's scorer, from its config)
    KV cache    (+ a hybrid's linear-attention states, B x their bytes per sequence: `kvbench.memory.state`)
                the preallocated cache, exact: `KVCache.nbytes_for` (K, V, positions, statistics), per
                group of layers (`kvbench.cache.storage.form_groups`: per-layer budgets give each layer its own
                capacity; sliding-window layers hold W - 1 + the widest forward, their trims planned like
                evictions); under a head rule whose counts are the data's (`data_dependent`: DMS's threshold)
                an upper bound, nothing evicted (`Account.upper_bound`; the cache measured stays at or under it);
                after_prefill: what only scores read (statistics, query window, a policy's own observations)
                goes at the compressed prompt's resize
    transient   the largest of (`kvbench.memory.terms`)
      forward of T tokens over N keys (every forward of the batch's plan, EOS changes no count):
          4·B·T·h·e hidden states (embeddings output, layer input, residual, normed input)
        + 2·B·T·D·e RoPE cos/sin + B·T·N mask (bool) + B·(s + 4·T)·8 token ids and positions
        + the largest of: MLP 3·B·T·I·e (4 with Phi-3's fused gate_up);
                          RoPE 4·B·T·Hq·D·e (+ Phi-3's fused qkv output in every attention phase);
                          SDPA 2·B·T·Hq·D·e + B·T·N·e (mask as float) + kernel workspace (CPU: the
                          flash kernel's per-thread blocks; CUDA: the logsumexp B·Hq·T·4) + on CUDA
                          with GQA, K/V expanded per query head 2·B·Hq·N·D·e (no fused kernel takes
                          GQA and a mask; charged for every forward, masked or not: an upper bound);
                          scores (scored policies) 2·B·T·Hq·D·e + B·Hq·t·(N·c + D·e) + B·t·N + O(B·H·N),
                          t = min(T, score_chunk) (one chunk's scores at a time), c = max(8, e + 4)
                          (float32 logits and softmax's output; float64's logits and their float32 copy);
                          (those two are `attention="sdpa"`, the default; "flash" drops the float
                          mask; the other backends replace both:)
                          eager B·T·Hq·D·e + repeat_kv 2·B·Hq·N·D·e (GQA) + S·c, S = B·Hq·T·N,
                          c = 8 (float32), 10 (half: logits, softmax's float32 copy of them and its
                          output, measured on CPU; 8 for float16 on CUDA, whose kernel upcasts as it
                          reads), 20 (float64);
                          or the output, its transposed copy and the query, 3·B·T·Hq·D·e;
                          fused 2·B·T·Hq·D·e + B·Hq·min(T, score_chunk)·N·2a + B·min(T, chunk)·N + O(B·H·N)
                          (models with sinks or soft-capping, which always run it: N + 1 keys, 3a);
                          logits B·V·e + B·T·h·e (logits_to_keep=1)
      eviction of b of the B rows over N pairs (+ the padded prompts B·s·8, alive between forwards):
          L·b·H·N·21 bytes (scores, sort values and int64
          indices, masks) + the K/V gather of `gather_layers` layers at a time: b = B gathers the
          kept pairs, gather_layers·B·H·keep·D·e; b < B first copies its rows out,
          gather_layers·b·H·(N + keep)·D·e + L·b·H·N·(4 + 8 if scored)
          + with policy.rerotate, the rotation of the kept keys from their written copies (`k_src`,
          `kvbench.cache.rotate.from_written`), in a = max(4, e) bytes:
          gather_layers·b·H·keep·(D·(4·a + (a if e < a) + e) + 8) (cos, sin, rotate_half, the product,
          the keys upcast, the result; the int64 angles' positions), + their copy when b < B,
          once the gathers are done (the larger of the two phases)
          + the keys' copy L·b·H·N·D·e for a policy that reads keys, and of its W kept queries
          L·b·Hq·W·D·e for a policy with a query window (b < B only)
          + the larger of (the scores, sort and gather above) and (the policy's own score computation,
          `Policy.score_bytes`, e.g. SnapKV's window logits, + its result)
      decode_only resize: the kv_size-slot cache, built while the prompt-sized one is alive
    + the prefill chunks' (B, K) int64 table (`prefill_chunks_of`, the same tensors), alive through the batch
Per-sample budgets (kv_ratio) and per-layer ones (PyramidKV) are planned group by group: a forward's
N is the largest group's, its masks are one per group (B·T·N_g each), an eviction of a group is charged
with that group's layers, and keep is the largest kept count of its rows (the gather's width).
Each device of a `device_map` split is charged the whole transient (an upper bound). Layers offloaded by
accelerate (their parameters on `meta`, in CPU RAM or on disk between forwards) are charged to the device
they compute on (their hook's execution device): their weights are no device's, and that device's
transient includes the largest offloaded layer's weights (brought in for its forward). Not counted:
Python objects, allocator fragmentation and caching, the CUDA context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench.attention import BACKENDS, resolve
from kvbench.batch_plan import EVICT, RESIZE, BatchPlan, Room, prefill_chunks_of
from kvbench.budgets import head_rule, knobs
from kvbench.cache import layer_capacities
from kvbench.cache.band import split_groups
from kvbench.cache.linear_state import attention_groups, split_shapes
from kvbench.memory.pass_bytes import pass_bytes
from kvbench.memory.shape import ModelShape
from kvbench.memory.state import state_bytes
from kvbench.memory.terms import cache_bytes, evict_bytes, forward_bytes, observe_bytes, trim_bytes
from kvbench.models.family import split_windows

GiB = 2**30


@dataclass(frozen=True)
class Footprint:
    """Accounted peak bytes of one batch on one device."""

    weights: int
    kv_cache: int
    transient: int
    kv_runs: tuple[tuple[int, int], ...] = ()  # (the KV cache, for n forwards): the batch's forwards in order

    @property
    def kv_steps(self) -> tuple[int, ...]:
        """The KV cache during each forward of the batch (its plan's steps)."""
        return tuple(b for b, n in self.kv_runs for _ in range(n))

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.transient


@dataclass(frozen=True)
class Account:
    """Accounted peak of one batch, per device (keys like "cpu", "cuda:0")."""

    devices: dict[str, Footprint]
    # the KV cache is the head rule's bound, not the count (`data_dependent`: DMS's threshold keeps what the scores
    # say): the cache measured stays at or under it, and reaches it when nothing is evicted
    upper_bound: bool = False

    @property
    def total(self) -> int:
        return sum(f.total for f in self.devices.values())

    def per_device(self) -> dict[str, int]:
        return {d: f.total for d, f in self.devices.items()}

    def describe(self, device: str) -> str:
        f = self.devices[device]
        return (
            f"{f.total / GiB:.3f} GiB (weights {f.weights / GiB:.3f} + KV cache {f.kv_cache / GiB:.3f}"
            f" + transient {f.transient / GiB:.3f})" + (", an upper bound: the kept pairs depend on the data"
                                                        if self.upper_bound else "")
        )


def policy_weights(s: ModelShape, policy, dev: str) -> int:
    """Bytes of the weights `policy` holds beside the model's on `dev`, for its decoder layers there (`Policy.
    weight_bytes`: KVzap's scorer); the account and serve mode's pool charge them."""
    return policy.weight_bytes(layers=s.layers.get(dev, 0), hidden=s.hidden, kv_heads=s.kv_heads, elem=s.elem,
                               model=s.name)


def fold(plan: BatchPlan) -> tuple[set, set, list[tuple[tuple[int, ...], int]]]:
    """What the account reads off a batch's plan (kvbench.batch_plan, the steps the engine executes): the forwards
    {(width T, each group's keys N, makes logits)}, the actions {(kind, group, held N, rows, most kept, capacity)}
    and the groups' capacities forward by forward, run-length coded [(capacities, forwards)]. A run of n quiet
    decode forwards (`BatchPlan.runs`) is its last one's keys: a forward's bytes never fall as its keys grow."""
    forwards, actions, caps = set(), set(), []
    for step, n in plan.runs():
        actions |= {(a.kind, a.group, a.held, 0 if a.rows is None else int(a.rows.sum()), a.most, a.capacity)
                    for a in step.before}
        forwards.add((step.width, tuple(k + n - 1 for k in step.keys), step.logits))
        if caps and caps[-1][0] == step.capacities:
            caps[-1] = (step.capacities, caps[-1][1] + n)
        else:
            caps.append((step.capacities, n))
    return forwards, actions, caps


def account(
    model_or_shape,
    lengths: list[int],
    policy,
    *,
    max_new_tokens: int,
    prefill_chunk: int | None = None,
    score_chunk: int = 64,
    attention: str = "sdpa",
    question: list[int] | None = None,
) -> Account:
    """The accounted peak of one batch of prompts with these token `lengths` (module docstring).

    `attention`: the backend the batch runs with (sdpa | flash | eager | fused, or auto: resolved per
    device like `kvbench.attention.resolve`); its attention transient is charged. `question`: per prompt, its last
    tokens that are the question (query-agnostic; `lengths` are then the contexts'), kept like generated tokens.
    """
    s = model_or_shape if isinstance(model_or_shape, ModelShape) else ModelShape.of(model_or_shape)
    if attention not in BACKENDS:
        raise ValueError(f"attention must be one of {', '.join(BACKENDS)}: {attention!r}")
    q = torch.tensor(question or [0] * len(lengths), dtype=torch.long, device="cpu")  # (B,) as the engine's Batch
    B, longest, q_max = len(lengths), max(x + n for x, n in zip(lengths, q.tolist(), strict=True)), int(q.max())
    new = max_new_tokens + q_max  # the question is kept like generated tokens
    layer_devices = [dev for dev, L in s.layers.items() for _ in range(L)]
    windows, bands = split_windows(list(s.windows) or [None] * len(layer_devices), longest + new,
                                   policy.kv_size if policy.evicts else None)  # a compressed windowed layer: the policy's
    full = [w is None and i not in s.linear for i, w in enumerate(windows)]  # a hybrid's linear layers: no K/V
    budgets = knobs.layer_budgets(policy, lengths, len(layer_devices), [i for i, f in enumerate(full) if f])  # (L, B)
    full_budgets = None if budgets is None or not any(full) else budgets[full]
    chunks = prefill_chunks_of(lengths, policy, prefill_chunk, full_budgets, bool(s.linear))
    widest = max([int(r.max()) for r in chunks] + [q_max])
    table = sum({r.untyped_storage().data_ptr(): r.untyped_storage().nbytes()  # the chunks' (B, K) table: the
                 for r in chunks}.values())  # engine's, alive through the batch
    caps = layer_capacities(knobs.capacities(policy, lengths, new, budgets, s.kv_heads), windows, lengths, new, widest)
    runs = split_groups(attention_groups(layer_devices, caps, budgets, windows, s.linear), bands)
    groups = [run for run, _ in (runs if s.shapes is None else split_shapes(runs, s.shapes))]  # as the cache's
    rooms = [Room(c, row, w) for _, _, c, row, w in groups]  # the cache's groups (kvbench.cache.linear_state.build)
    if budgets is None:  # the full cache: one row of "never" budgets
        groups = [(d, ls, c, torch.full((B,), c, dtype=torch.long, device="cpu"), w) for d, ls, c, _, w in groups]
    scored = policy.needs.attention
    forwards, actions, step_caps = fold(BatchPlan(policy, rooms, chunks, max_new_tokens, q, s.kv_heads, B))
    devices = {}
    for dev in s.layers:
        mine = [gi for gi, g in enumerate(groups) if str(g[0]) == dev]
        backend = resolve(attention, device_type=dev.split(":")[0], dtype=s.dtype, needs_attention=scored,
                          manual=s.manual)
        transients = [  # the device's layers attend over their groups' keys; one mask per group lives on
            forward_bytes(s, B, T, max(keys[gi] for gi in mine), longest, scored, logits, score_chunk, dev == "cpu",
                          backend, mask_keys=sum(keys[gi] for gi in mine), observe=observe_bytes(s, B, T, policy))
            for T, keys, logits in forwards
        ]
        for kind, gi, N, rows, keep, cap in actions:
            if gi not in mine:
                continue
            L, sg = len(groups[gi][1]), s.of_layer(groups[gi][1][0])  # the group's (H_kv, D)
            if kind == RESIZE:  # the smaller copy of a compressed prompt, built while the prompt-sized one lives
                transients.append(cache_bytes(sg, B, L, cap, policy))
            else:  # + the padded prompts (int64), alive throughout
                transients.append(B * longest * 8 + (evict_bytes(sg, L, B, N, rows, keep, policy) if kind == EVICT
                                                     else trim_bytes(sg, L, rows, keep)))
        transients.append(pass_bytes(s, policy, lengths, score_chunk, dev == "cpu", backend))  # scoring passes
        state = state_bytes(s, B, [layer_devices[i] for i in s.linear].count(dev))  # a hybrid's linear layers
        first = step_caps[0][0]  # after_prefill: a group settles at its resize (kvbench.engine.evictions)
        held = {c: sum(cache_bytes(s.of_layer(groups[gi][1][0]), B, len(groups[gi][1]), c[gi], policy, groups[gi][4],
                                   settled=policy.once and c[gi] < first[gi])
                       for gi in mine) + state
                for c, _ in step_caps}  # the cache with these capacities (only a resize changes them)
        kv = tuple((held[c], n) for c, n in step_caps)  # the cache during each run of forwards
        onload = s.onload.get(dev, 0)  # an offloaded layer's weights, brought here for its forward (accelerate)
        devices[dev] = Footprint(weights=s.weights.get(dev, 0) + policy_weights(s, policy, dev),
                                 kv_cache=max(b for b, _ in kv), transient=max(transients) + onload + table, kv_runs=kv)
    for dev, w in s.weights.items():  # devices with weights but no decoder layer (e.g. the lm_head's)
        devices.setdefault(dev, Footprint(weights=w, kv_cache=0, transient=0))
    return Account(devices, upper_bound=policy.evicts and head_rule(policy).data_dependent)
