"""A hybrid model's linear-attention states in the memory account (kvbench.models.family.hybrid).

Each linear layer holds a conv state and a float32 recurrent state per sequence, whatever its length, allocated
at the batch's first forward and never evicted: B x its bytes per sequence, charged beside the KV cache of the
attention layers (`KVCache.allocated_bytes()` counts both). The linear layers hold no K/V, so the account's groups
of layers leave them out (`attention_groups`). Not charged: the transients of their prefill (the chunked gated delta
rule's float32 copies of q, k, v, its chunk tensors, the conv input).
"""

from __future__ import annotations


def state_bytes(shape, batch: int, layers_here: int) -> int:
    """The states of `layers_here` of the model's linear layers for `batch` sequences."""
    if not shape.linear or not layers_here:
        return 0
    return batch * shape.state_bytes_per_sequence * layers_here // len(shape.linear)


