"""What transformers sees of one layer of a `KVCache`: a `CacheLayerMixin` whose `update` writes the chunk into
the cache's storage and returns the kept pairs. A view refers to its cache weakly (no reference cycle)."""

from __future__ import annotations

import weakref

from transformers.cache_utils import CacheLayerMixin


class LayerView(CacheLayerMixin):
    """What transformers sees for one layer: `update` writes the chunk and returns the kept pairs."""

    is_sliding = False

    def __init__(self, cache, layer_idx: int):
        super().__init__()
        self._cache = weakref.ref(cache)  # a strong reference would make a cycle: cache.layers -> view -> cache
        self.layer_idx = layer_idx
        self.is_initialized = True

    @property
    def cache(self) -> object:
        cache = self._cache()
        if cache is None:
            raise RuntimeError("the KV cache of this layer view no longer exists")
        return cache

    def lazy_initialization(self, key_states, value_states) -> None:  # storage is preallocated
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        return self.cache.write(self.layer_idx, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cache.step_keys, 0

    def get_seq_length(self) -> int:
        return int(self.cache.group_of(self.layer_idx).n.max())

    def get_max_length(self) -> int:
        return self.cache.group_of(self.layer_idx).capacity
