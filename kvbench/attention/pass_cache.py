"""A hybrid model's scoring passes continue from each row's linear-attention state, read-only.

A scoring pass (kvbench.attention.pass_step: KVzip's, KVzip+'s and KVgrad's repetitions of the context) is the model
reading more tokens after the context. Its attention layers read the context's held pairs through the pass step; its
linear-attention layers (Gated-DeltaNet, kvbench.cache.linear_state) must start from the state the context left, or
the pass would be a model that never read the context at three layers in four. `pass_cache` hands the decoder a
transformers `Cache` whose linear layers hold the context's states for the pass to read, never to write
(`ReadOnlyState`: the conv window and recurrent state after the context, whatever the pass computes), and whose
attention layers pass the pass's own K/V through (`PassThrough`: the pass step reads the held pairs itself, and the
pass's pairs are never kept). The rows' pass tokens are then left-aligned (pads after them: a pad between the context
and a pass token would reach the state; after the real tokens it reaches no real one).
"""

from __future__ import annotations

import copy

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, LinearAttentionLayer


class PassThrough(CacheLayerMixin):
    """An attention layer of the pass: its K/V go to the pass step as computed, and nowhere else."""

    is_sliding = False

    def __init__(self):
        super().__init__()
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, 0

    def get_seq_length(self) -> int:
        return 0

    def get_max_length(self) -> int:
        return -1


class ReadOnlyState(LinearAttentionLayer):
    """A copy of a linear layer's state after the context: the pass reads it and leaves it as it was."""

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, **kwargs) -> torch.Tensor:
        """The context's conv window (B, C, K) followed by the pass's inputs (B, C, T), as the convolution reads them."""
        return torch.cat([self.conv_states[state_idx], conv_states], dim=-1)

    def update_recurrent_state(self, recurrent_states, state_idx: int = 0, **kwargs) -> torch.Tensor:
        return recurrent_states if isinstance(recurrent_states, torch.Tensor) else recurrent_states[-1]

    def increase_count(self, state_idx: int) -> None:
        pass


def read_only(layer: LinearAttentionLayer, grad: bool) -> ReadOnlyState:
    """A view of `layer`'s states the pass reads: the same tensors (no copy: nothing writes them; `record_past` keeps a
    one-token pass off the convolution's in-place update), or, for a pass with autograd (`grad`), copies as normal
    tensors (the inference-mode states cannot be saved for its backward; the account charges them)."""
    out = copy.copy(layer)
    out.__class__ = ReadOnlyState
    out.record_past = True
    if grad:
        with torch.inference_mode(False):
            out.conv_states = {i: None if t is None else t.clone() for i, t in layer.conv_states.items()}
            out.recurrent_states = {i: None if t is None else t.clone() for i, t in layer.recurrent_states.items()}
    return out


def pass_cache(num_layers: int, linear: dict, grad: bool = False) -> Cache | None:
    """The decoder's cache for a pass over a hybrid whose linear layers `linear` ({layer: LinearAttentionLayer}) hold
    the context's states; None for a model without linear layers (the pass runs without a cache)."""
    if not linear:
        return None
    return Cache(layers=[read_only(linear[i], grad) if i in linear else PassThrough() for i in range(num_layers)])
