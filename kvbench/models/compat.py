"""Differences between transformers 5.x releases that kvbench bridges in one place.

transformers 5.24 renamed the `past_key_values` argument of the models' `forward` to `cache`; the old
name still works with a FutureWarning and goes in 5.40. kvbench accepts any 5.x (pyproject), so it
passes its cache under the name the loaded model's `forward` declares.
"""

from __future__ import annotations

import functools
import inspect


@functools.cache
def _cache_kwarg(forward_of: type) -> str:
    params = inspect.signature(forward_of.forward).parameters  # the decorator keeps the real signature
    return "cache" if "cache" in params else "past_key_values"


def cache_kwarg(module) -> str:
    """The keyword under which `module.forward` takes the KV cache: `cache` (transformers >= 5.24) or
    `past_key_values` (earlier)."""
    return _cache_kwarg(type(module))
