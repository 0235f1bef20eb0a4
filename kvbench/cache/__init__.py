"""The evicting KV cache: preallocated, compacted per sample, shrunk by a policy between forwards.

Layers on the same device that share a capacity and a budget row are stacked into one group, so
eviction is vectorised over layers, heads and samples. Every KV head of a layer of sample b holds the
same count n_b (heads keep *different* positions), so the attention mask depends only on the sample and
broadcasts over heads (SDPA with GQA stays usable). With one budget everywhere (every policy but
PyramidKV) that is one group per device; with per-layer budgets each layer is its own group with its
own capacity (its memory is its own budget's). Sliding-window layers form their own groups, which hold
only their window and are never compressed by a policy. Pad tokens are never stored: a forward writes only each
sample's real tokens.

The rooms, one idea each:
    storage.py   a group's tensors and how layers form groups (`Group`, `form_groups`)
    layout.py    one forward's layout: write slots, masks, positions (`Step`, `layout_forward`)
    evict.py     select what to keep (pure) and gather it back in position order; slicing for keeps_newest
    rotate.py    RoPE re-rotation of kept keys, from the keys as written (no compounding rounding)
    query_window.py  SnapKV's observation window: the newest W queries
    views.py     `LayerView`: what transformers sees of one layer (its `update` writes into the cache)
    heads.py     per-head counts under head budgets that differ by KV head (AdaKV, KVzip's global ranking)
    band.py      windowed layers a policy compresses (a budget below the layer's sliding window)
    sink.py      where one layer's attention puts what the policy reads (statistics, queries, observe step)
    qgroup.py    a quantized group (`gen.kv_cache_dtype=int8|int4`): K/V in a `QuantKV`, read dequantized
    linear_state.py  a hybrid model's linear-attention layers (transformers' own state) beside the K/V groups
    kvcache.py   `KVCache`, the transformers `Cache` facade the engine and attention call
"""

from kvbench.cache.kvcache import KVCache
from kvbench.cache.layout import Step
from kvbench.cache.storage import Group, form_groups, layer_capacities

__all__ = ["KVCache", "Group", "Step", "form_groups", "layer_capacities"]
