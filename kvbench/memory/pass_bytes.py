"""The account's term of a policy's scoring passes (kvbench.attention.pass_step): transient bytes of the largest pass.

A pass of T tokens (`Policy.pass_width`: the widest pass of a context, an upper bound before `prepare`) over N
held pairs runs the decoder on (B, T) with the engine's attention over N + T keys: the forward's own buffers
(`forward_bytes` over N + T keys), the keys and values concatenated (K and V, (B, H_kv, N + T, D)), the mask and
SDPA's float copy of it, the expanded K/V and weights of SDPA's GQA path on the CPU, or the policy's restricted
attention (`Policy.pass_bytes`), beside the layer's buffers (or the forward's largest phase, the MLP's); and the per-pair statistic kept over the passes ((L, B, H_kv, N), twice while the
running max is taken).

A pass with autograd (`needs.pass_grad`, kvbench.attention.pass_grad) keeps its graph until the backward: `graph_bytes`,
what autograd saves with the parameters frozen (no layer input kept for a weight gradient), per layer: the MLP's
three (B, T, I), the two norms' float32 inputs and scales, the query and the attention output, the concatenated K
and V, the mask as the query's dtype and the softmax's log-sum-exp; the rotary tables and the final norm's once.
Beside it: each layer's retained output gradient and the deferred scoring's inputs (own keys, hidden states), and
the backward's largest layer (its MLP's gradients, the K/V gradients, the residual's); on a hybrid, a copy of each
row's linear-attention state (kvbench.attention.pass_cache: autograd cannot save the inference-mode states).
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
    fused = attend  # with autograd, CPU SDPA runs its fused kernel (it saves the log-sum-exp, not the weights)
    attend += B * Hq * T * K * max(4, e) if cpu else 0  # CPU SDPA with a mask: the math path's weights
    own = policy.pass_bytes(rows=B, kv_heads=H, q_heads=Hq, tokens=T, pairs=N, head_dim=D, elem=e)
    state = 2 * L * B * H * N * e
    total = max(forward, base + 2 * q + max(attend, 2 * B * H * K * D * e + own))
    if policy.needs.pass_grad:
        kept = L * (2 * B * T * s.hidden * e + B * H * T * D * e)  # retained gradients, deferred inputs
        backward = 3 * B * T * s.intermediate * e + 2 * B * H * K * D * e + 2 * B * T * s.hidden * e
        total = max(total, graph_bytes(s, B, T, K, L) + kept + max(backward, base + 2 * q + fused), kept + total)
        total += B * s.state_bytes_per_sequence  # a hybrid's linear states, copied for autograd (pass_cache)
    return total + state


def graph_bytes(s: ModelShape, B: int, T: int, K: int, L: int) -> int:
    """Bytes autograd saves over `L` layers of a (B, T) forward attending over K keys, parameters frozen."""
    e, H, Hq, D = s.elem, s.kv_heads, s.q_heads, s.head_dim
    layer = (3 * B * T * s.intermediate * e + 2 * B * T * (s.hidden + 1) * 4 + 2 * B * Hq * T * D * e
             + 2 * B * H * K * D * e + B * T * K * e + B * Hq * T * 4)
    return L * layer + 2 * B * T * D * e + 2 * B * T * (s.hidden + 1) * 4 + B * T * 4
