"""The account's terms for a quantized cache (`ModelShape.kv_quant`, gen.kv_cache_dtype=int8 | int4): what reading
and compacting quantized pairs allocates on top of a cache in the model's dtype (kvbench.cache.qgroup).

e = bytes of the model dtype, H KV heads, D head size, N pairs read of which Q = q(N) quantized (whole blocks of
G, kvbench.quant.qsplit) and a window of C_r = R + G - 1 slots:

    held      2·B·H·N·D·e: a layer's keys and values read dequantized, alive through its attention (a cache in
              the model's dtype returns views of its slots instead)
    write     appending a chunk of T: the window and the chunk as one sequence, keys and values, while the
              next one is concatenated, its oldest whole blocks quantized (kvbench.quant.qappend)
    read      the read itself: both quantized parts dequantized 2·Q·e, the keys' result N·e, the values'
              concatenation with the window (Q + C_r)·e and result N·e, per (B, H, D), + their int64 indices
              B·H·N·8 (or while dequantizing: the float32 product and its cast Q·(4 + e) after the keys' Q·e)
    evict     a policy that scores keys or values reads every layer's, dequantized and stacked (twice while
              stacking): 2·L·b·H·N·D·e each; then per layer the store keeps: a read of the b rows (held +
              read), the kept pairs taken 2·b·H·K·D·e and their new blocks quantized: float32 copies and
              codes b·H·Q_K·D·(4 + 1) per tensor
"""

from __future__ import annotations

from kvbench.memory.shape import ModelShape
from kvbench.quant.qsplit import quantized_count


def _read(s: ModelShape, B: int, N: int) -> int:
    """Bytes alive at the peak of reading one layer's N pairs of B rows (the held result included)."""
    q, e = s.kv_quant, s.elem
    Q, Cr = quantized_count(N, q.group, q.residual), q.residual + q.group - 1
    per = B * s.kv_heads * s.head_dim
    return per * max(2 * Q * e + 2 * N * e + (Q + Cr) * e, Q * (4 + 2 * e)) + B * s.kv_heads * N * 8


def held_bytes(s: ModelShape, B: int, N: int) -> int:
    """A layer's pairs read dequantized, alive through its attention (0 for a cache in the model's dtype)."""
    return 0 if s.kv_quant is None else 2 * B * s.kv_heads * N * s.head_dim * s.elem


def read_bytes(s: ModelShape, B: int, N: int) -> int:
    """The peak of reading a layer's pairs (0 for a cache in the model's dtype)."""
    return 0 if s.kv_quant is None else _read(s, B, N)


def write_bytes(s: ModelShape, B: int, T: int, N: int) -> int:
    """The peak of appending a chunk of T tokens to one layer (kvbench.quant.qappend): the window and the chunk as
    one sequence of J = min(N, C_r + T) pairs, keys and values, and its F = q(J) oldest quantized (a copy,
    float32 numbers, codes); 0 for a cache in the model's dtype."""
    if s.kv_quant is None:
        return 0
    q, e = s.kv_quant, s.elem
    J = min(N, q.residual + q.group - 1 + T)
    F = quantized_count(J, q.group, q.residual)
    return B * s.kv_heads * s.head_dim * (2 * J * e + (J + T) * e + F * (e + 4 + 2))


def scored_bytes(s: ModelShape, L: int, rows: int, N: int, policy) -> int:
    """The keys and values a policy's score reads from `rows` of a quantized group: every layer's, dequantized and
    stacked. The layers' reads are as large again, alive only while they are stacked (kvbench.memory.terms)."""
    return (policy.needs.keys + policy.needs.values) * L * rows * s.kv_heads * N * s.head_dim * s.elem


def keep_bytes(s: ModelShape, rows: int, N: int, keep: int) -> int:
    """The peak of one layer's compaction in the store (kvbench.quant.qkeep): the rows' pairs read, the kept ones
    taken, their new blocks quantized."""
    e, H, D = s.elem, s.kv_heads, s.head_dim
    Qk = quantized_count(keep, s.kv_quant.group, s.kv_quant.residual)
    return _read(s, rows, N) + 2 * rows * H * keep * D * e + 2 * rows * H * Qk * D * 5
