"""The account's terms: transient bytes of one forward, one eviction, one window trim, and a cache's bytes.

Pure arithmetic on a `ModelShape` and counts (no tensor is allocated), each term following the code path
kvbench runs (transformers' Llama / Phi-3 layers, `kvbench.attention`'s backends, `kvbench.cache`'s eviction);
`kvbench.memory.accounting` folds a batch's plan and takes the largest of them. The formulas are in
that module's docstring; tests/memory/test_account.py checks them against the tensor bytes allocated on CPU.
"""

from __future__ import annotations

import torch

from kvbench.budgets import head_rule
from kvbench.cache import KVCache
from kvbench.memory import qterms
from kvbench.memory.shape import ModelShape

HIDDEN_BUFFERS = 4  # (B, T, h) tensors alive through a decoder layer
ID_BUFFERS = 4  # (B, T) int64 tensors of a forward's bookkeeping
ROPE_BUFFERS = 4  # query-sized tensors alive while RoPE rotates the queries
EVICT_BYTES = 21  # per (layer, sample, head, pair) in an eviction: score 4, sort values 4 + indices 8, masks
ROTATE_ACC = 4  # re-rotation: cos, sin, rotate_half and the product, per key element, in float32 (float64 models: float64)
GATHER_LAYERS = KVCache.__init__.__kwdefaults__["gather_layers"]  # the engine builds caches with the default


def cpu_sdpa_workspace(T: int, N: int, D: int, e: int) -> int:
    """Per-thread blocks of PyTorch's CPU flash-attention kernel (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp)."""
    q_split = min(T, 256 if T >= 768 else 64 if T >= 192 else 32)
    kv_split = min(N, 512)
    accum = q_split * kv_split + 2 * q_split + q_split * D  # float32 scores, max, sum, output accumulator
    reduced = q_split * kv_split * e if e < 4 else 0  # half types keep a copy of the scores
    return torch.get_num_threads() * (accum * 4 + reduced)


def forward_bytes(
    s: ModelShape, B: int, T: int, N: int, longest: int, scored: bool, logits: bool, chunk: int, cpu: bool,
    attention: str = "sdpa", mask_keys: int | None = None, observe: int = 0,
) -> int:
    """Transient bytes of one forward over a (B, T) chunk that attends to N keys (`mask_keys`: the sum of
    every group's N, one mask each; default N). `attention`: the backend really used (already resolved);
    `observe`: a policy's observe step (`observe_bytes`), after the layer's attention, its output alive."""
    e, h, D, Hq = s.elem, s.hidden, s.head_dim, s.q_heads
    q = B * T * Hq * D * e  # one query-sized tensor
    ids = B * (longest + ID_BUFFERS * T) * 8  # the padded prompts, the chunk's ids, slots, positions
    base = ids + HIDDEN_BUFFERS * B * T * h * e + 2 * B * T * D * e + B * T * (N if mask_keys is None else mask_keys)
    qkv = B * T * (Hq + 2 * s.kv_heads) * D * e if s.fused_qkv else 0
    phases = [s.mlp_buffers * B * T * s.intermediate * e, qkv + ROPE_BUFFERS * q]
    stats = 3 * B * s.kv_heads * N * max(4, e)  # w_sum, w_last and a reduction of them
    if attention == "eager":  # kvbench.attention.eager: transformers' eager path, nothing chunked
        S = B * Hq * T * N  # elements of the (B, Hq, T, N) probabilities
        # softmax(dtype=float32)'s float32 copy of its input (aten's softmax: `input.toType(dtype)`), none in float32
        # and none for CUDA's float16 (its half_to_float kernel upcasts as it reads); measured on CPU
        conv = 0 if e == 4 or (not cpu and s.dtype == torch.float16) else 4
        probs = max(2 * e, e + conv + 4, (2 * e + 4) if e != 4 else 0) * S  # logits + scaled / masked / softmax / cast
        rep = 2 * B * Hq * N * D * e if Hq != s.kv_heads else 0  # repeat_kv's copies of K and V
        phases.append(qkv + q + rep + max(probs, S * e + q + (stats if scored else 0)))
        phases.append(qkv + 3 * q)  # the output, its transposed copy and the query
    elif attention == "fused":  # kvbench.attention.fused (scored policies; models with sinks or soft-capping)
        a = max(4, e)
        tc = min(T, chunk)
        # logits + probabilities (float32, one more column for a sink; soft-capping's tanh a third), the mask's inverse
        chunk_bytes = (B * Hq * tc * (N + 1) * 3 * a if s.manual else B * Hq * tc * N * 2 * a) + B * tc * N
        phases.append(qkv + 2 * q + chunk_bytes + (stats if scored else 0))
    else:
        workspace = cpu_sdpa_workspace(T, N, D, e) if cpu else B * Hq * T * 4  # CUDA: the logsumexp
        mask = B * T * N * e if attention != "flash" else 0  # SDPA's float copy of the bool mask
        # CUDA SDPA, GQA with a mask: kvbench.attention.sdpa expands K/V per query head (no fused kernel has both)
        rep = 2 * B * Hq * N * D * e if not cpu and attention != "flash" and Hq != s.kv_heads else 0
        phases.append(qkv + 2 * q + mask + workspace + rep)
        if scored:  # kvbench.attention.pair_weights.attention_stats: one chunk of queries at a time (the last one's
            tc = min(T, chunk)  # scores are dropped first); per element its float32 logits and softmax's output, or
            per = max(8, e + 4)  # a float64 model's logits beside their float32 copy
            scores = B * Hq * tc * (N * per + D * e) + B * tc * N + stats
            phases.append(qkv + 2 * q + scores)
    if s.kv_quant is not None:  # a quantized cache (kvbench.memory.qterms): the read pairs, alive through attention
        phases = phases[:2] + [p + qterms.held_bytes(s, B, N) for p in phases[2:]] + [
            qkv + 2 * q + max(qterms.read_bytes(s, B, N), qterms.write_bytes(s, B, T, N))]
    if observe:
        phases.append(qkv + 2 * q + observe)
    if logits:
        phases.append(B * s.vocab * e + B * T * h * e)
    return base + max(phases)


def evict_bytes(s: ModelShape, L: int, B: int, N: int, rows: int, keep: int, policy) -> int:
    """Transient bytes of one eviction of `rows` of the B samples, L layers, from N pairs down to `keep`."""
    scored = policy.needs.attention
    if rows == B:  # every row: the statistics are sliced in place and K/V gather only the kept pairs
        copies, gathered = 0, B * keep
    else:  # a subset: its positions (+ statistics) and its N pairs are copied out first
        copies, gathered = 4 + (8 if scored else 0), rows * (N + keep)
    nd = policy.needs
    if nd.observes and rows < B:  # a policy's own per-pair statistics copied out too (needs.pair_state)
        copies += 4 * len(nd.pair_state)
    gather = min(GATHER_LAYERS, L) * s.kv_heads * gathered * s.head_dim * s.elem  # gather_layers at a time
    if policy.rerotate:  # kvbench.cache.rotate.from_written on the kept keys: cos, sin, rotate_half, product (acc dtype)
        e, a = s.elem, max(4, s.elem)
        per_key = s.head_dim * (ROTATE_ACC * a + (a if e < a else 0) + e + (e if rows < B else 0)) + 8
        gather = max(gather, min(GATHER_LAYERS, L) * s.kv_heads * rows * keep * per_key)  # after the gathers
    needs = nd  # a subset of the rows: the keys / values the score reads are copied out (advanced indexing)
    keys = (needs.keys + needs.values) * L * rows * s.kv_heads * N * s.head_dim * s.elem if rows < B else 0
    stacking = 0
    if s.kv_quant is not None:  # kvbench.memory.qterms: a quantized group reads its pairs and keeps them itself
        keys, gather = qterms.scored_bytes(s, L, rows, N, policy), qterms.keep_bytes(s, rows, N, keep)
        stacking = keys  # the layers' reads: alive with the stack only while it is built, before the score
    keys += L * rows * s.q_heads * policy.needs.queries * s.head_dim * s.elem if rows < B else 0  # kept queries
    if nd.observes and rows < B:  # its row state, as the score reads it (needs.row_state)
        keys += 4 * L * rows * nd.row_elements(s.q_heads, s.kv_heads, s.head_dim)
    own = policy.score_bytes(layers=L, rows=rows, kv_heads=s.kv_heads, q_heads=s.q_heads, pairs=N,
                             head_dim=s.head_dim, elem=s.elem)  # freed before the sort and the gather start
    pairs = L * rows * s.kv_heads * N
    heads = pairs * head_rule(policy).transient  # the head rule's counts (AdaKV's), 0 under uniform budgets
    return pairs * copies + keys + max(pairs * EVICT_BYTES + gather, pairs * 4 + own, heads, stacking)


def trim_bytes(s: ModelShape, L: int, rows: int, keep: int) -> int:
    """Transient bytes of a windowed group's trim (`kvbench.cache.evict.keep_newest`): the newest `keep` slots of
    the rows, copied out `gather_layers` layers at a time (K, V) and for every layer at once (positions)."""
    return min(GATHER_LAYERS, L) * rows * s.kv_heads * keep * s.head_dim * s.elem + L * rows * s.kv_heads * keep * 4


def cache_bytes(s: ModelShape, B: int, L: int, slots: int, policy, window: int | None = None,
                settled: bool = False) -> int:
    """Bytes of a preallocated cache group of L layers and `slots` slots per sample (`KVCache.nbytes_for`);
    `settled`: after_prefill's compressed group, its scores' inputs given back (`Group.settle`)."""
    return KVCache.nbytes_for(
        batch_size=B, num_layers=L, num_kv_heads=s.kv_heads, head_dim=s.head_dim, capacity=slots, dtype=s.dtype,
        track_attention=policy.needs.attention and not settled, num_q_heads=s.q_heads,
        query_window=0 if settled else policy.needs.queries, rerotate=policy.rerotate and policy.evicts,
        window=window, quant=s.kv_quant, own=policy.needs if policy.needs.observes and not settled else None,
    )


def observe_bytes(s: ModelShape, B: int, T: int, policy) -> int:
    """Transient bytes of a policy's observe step in one layer of a (B, T) forward (kvbench.policies.needs): the new
    pairs' keys and values handed to it, its per-pair statistics, and what `Policy.observe_bytes` says it allocates."""
    nd = policy.needs
    if not nd.observes:
        return 0
    return (2 * B * T * s.kv_heads * s.head_dim * s.elem + 4 * B * T * s.kv_heads * len(nd.pair_state)
            + policy.observe_bytes(rows=B, tokens=T, q_heads=s.q_heads, kv_heads=s.kv_heads, head_dim=s.head_dim,
                                   hidden=s.hidden, elem=s.elem))

