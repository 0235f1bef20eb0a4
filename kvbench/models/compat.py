"""Differences between transformers 5.x releases that kvbench bridges in one place.

transformers 5.24 renamed the `past_key_values` argument of the models' `forward` to `cache`; the old
name still works with a FutureWarning and goes in 5.40. kvbench accepts any 5.x (pyproject), so it
passes its cache under the name the loaded model's `forward` declares.
"""

from __future__ import annotations

import inspect


def cache_kwarg(module) -> str:
    """The keyword under which `module.forward` takes the KV cache: `cache` (transformers >= 5.24) or
    `past_key_values` (earlier). The deprecation decorator keeps the real signature."""
    return "cache" if "cache" in inspect.signature(type(module).forward).parameters else "past_key_values"
