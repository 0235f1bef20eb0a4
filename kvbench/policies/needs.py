"""What a policy's score reads: its declaration, from which the engine keeps (and the memory account charges) it.

A policy declares `needs` (a class-level `Needs`, or a property where a field sets a size, e.g. SnapKV's
window); the static cache (kvbench.cache), the paged pool (kvbench.serve) and the account (kvbench.memory)
read the same declaration, so a policy that declares nothing pays nothing. What the score then receives is a
`kvbench.policies.policy.ScoreContext`.

attention: running per-pair attention statistics (sum_w, last_w), collected inside attention
keys:      the cached keys (RoPE applied)
values:    the cached values
queries:   the newest W queries processed (RoPE applied), with their positions and the softmax scale
passes:    scoring passes: extra forwards over token sequences built from each row's context, run at the
           compression point (`Policy.scoring_passes`, `Policy.pass_scores`; kvbench.attention.pass_step), whose per-pair
           statistic the score reads as `ScoreContext.passed`
pass_grad: the scoring passes run with autograd (kvbench.attention.pass_grad): each pass's objective, the sum over
           its real tokens of ||last decoder layer's output||^2 (float32), is backpropagated (parameters frozen) and
           `pass_scores` runs after the backward, `PassContext.grad` giving ||dPhi / d attention output|| per token;
           the pass's graph is charged in the memory account (kvbench.memory.pass_bytes)
hidden:    the layer's input hidden states (the attention module's `hidden_states`: after input_layernorm, what
           enters q/k/v), handed to `Policy.observe` at every forward; captured by a forward pre-hook on each
           attention module, registered for the run only when declared (kvbench.attention.kv_attention)
module:    the attention modules (q_proj, k_proj, o_proj, q_norm, k_norm) and the model's rotary embedding, in
           the observation and in ScoreContext (`modules`, `rotary`); kvbench.models.prerope applies them
pair_state: names of float32 statistics stored with each pair (e.g. KVzap's score at arrival): `observe` returns
           them for the forward's new pairs, {name: (B, H_kv, T)}; the cache/pool compact them with the pairs;
           the score reads them as `ctx.pair[name]` (L, B, H_kv, N)
row_state: (name, shape) float32 running state per (layer, row), shape in the symbols "Hq", "H", "D" or ints
           (e.g. ExpectedAttention's query count, mean and centred scatter): `observe` updates
           `obs.state[name]` (B, *shape) in place; the score reads `ctx.state[name]` (L, B, *shape)

The observe step (declared by any of hidden/module/pair_state/row_state): once per layer per forward (every
prefill chunk, question forward and decode step; static and serve mode), after the layer's new pairs are
written, `policy.observe(obs)` receives an `Observation`. In serve mode one observation per request (B = 1).
Memory: pair state 4 bytes per pair per name, row state its declared float32 elements per (layer, row), both
allocated and charged from this declaration; the hidden states are the model's own activations (no copy kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Needs:
    attention: bool = False
    keys: bool = False
    values: bool = False
    queries: int = 0
    passes: bool = False
    pass_grad: bool = False
    hidden: bool = False
    module: bool = False
    pair_state: tuple[str, ...] = ()
    row_state: tuple[tuple[str, tuple], ...] = ()

    @property
    def any(self) -> bool:
        """Whether the score reads anything besides positions and counts."""
        return self.attention or self.keys or self.values or self.queries > 0 or self.passes or self.observes

    @property
    def observes(self) -> bool:
        """Whether `Policy.observe` runs at every forward (kvbench.attention's observe step)."""
        return self.hidden or self.module or bool(self.pair_state) or bool(self.row_state)

    def row_shapes(self, q_heads: int, kv_heads: int, head_dim: int) -> dict[str, tuple[int, ...]]:
        """Each row-state tensor's shape per (layer, row), its symbols resolved."""
        dims = {"Hq": q_heads, "H": kv_heads, "D": head_dim}
        return {name: tuple(dims.get(d, d) for d in shape) for name, shape in self.row_state}

    def row_elements(self, q_heads: int, kv_heads: int, head_dim: int) -> int:
        """float32 elements of row state per (layer, row)."""
        return sum(int(torch.Size(s).numel()) for s in self.row_shapes(q_heads, kv_heads, head_dim).values())


@dataclass
class Observation:
    """One layer's forward as `Policy.observe` sees it (B rows; serve mode: one request, B = 1).

    layer:     the decoder layer's index
    module:    its attention module (q_proj, k_proj, o_proj, q_norm/k_norm where the family has them)
    hidden:    (B, T, hidden) the layer's input hidden states of the forward's T positions; None unless needs.hidden
    positions: (B, T) long, each column's true position (pads: 0)
    real:      (B, T) bool, which columns are real tokens (static mode pads on the left)
    query:     (B, Hq, T, D) the forward's queries, RoPE applied; key, value (B, H_kv, T, D) its new pairs (key RoPE'd)
    scaling:   the softmax scale
    state:     {name: (B, *shape)} float32 row state of this layer (update in place)
    rotary:    the model's rotary embedding module (None when not found)
    """

    layer: int
    module: object
    hidden: torch.Tensor | None
    positions: torch.Tensor
    real: torch.Tensor
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    scaling: float
    state: dict = field(default_factory=dict)
    rotary: object = None
