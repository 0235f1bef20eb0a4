"""The account's term of a policy's scoring passes (kvbench.attention.pass_step): transient bytes of the largest pass.

A pass of T tokens (`Policy.pass_width`: the widest pass of a context, an upper bound before `prepare`) over N
held pairs runs the decoder on (B, T) with the engine's attention over N + T keys: the forward's own buffers
(`forward_bytes` over N + T keys), the keys and values concatenated (K and V, (B, H_kv, N + T, D)), the mask and
SDPA's float copy of it, the expanded K/V and weights of SDPA's GQA path on the CPU, or the policy's restricted
attention (`Policy.pass_bytes`), beside the layer's buffers (or the forward's largest phase, the MLP's); and the per-pair statistic kept over the passes ((L, B, H_kv, N), twice while the
running max is taken).
"""

from __future__ import annotations

from kvbench.memory.shape import ModelShape
from kvbench.memory.terms import HIDDEN_BUFFERS, ID_BUFFERS, forward_bytes


def pass_bytes(s: ModelShape, policy, lengths: list[int], score_chunk: int, cpu: bool, backend: str) -> int:
    """Transient bytes of the widest scoring pass over a batch of contexts of these lengths (0: no pass)."""
    if not (policy.needs.passes and policy.evicts):
        return 0
    B, N = len(lengths), max(lengths)
    T = max(policy.pass_width(n) for n in lengths)
    e, H, Hq, D, L = s.elem, s.kv_heads, s.q_heads, s.head_dim, sum(s.layers.values())
    K = N + T
    forward = forward_bytes(s, B, T, K, N, False, False, score_chunk, cpu, "sdpa")  # its largest phase: the MLP's
    base = B * (N + ID_BUFFERS * T) * 8 + HIDDEN_BUFFERS * B * T * s.hidden * e + 2 * B * T * D * e + B * T * K
    q = B * T * Hq * D * e  # the query and the output, alive through the layer's attention
    attend = 2 * B * H * K * D * e + B * T * K * (1 + e) + (2 * B * Hq * K * D * e if Hq != H else 0)
    attend += B * Hq * T * K * max(4, e) if cpu else 0  # CPU SDPA with a mask: the math path's weights
    own = policy.pass_bytes(rows=B, kv_heads=H, q_heads=Hq, tokens=T, pairs=N, head_dim=D, elem=e)
    state = 2 * L * B * H * N * e
    return max(forward, base + 2 * q + max(attend, 2 * B * H * K * D * e + own)) + state
