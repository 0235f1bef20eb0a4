"""Eviction policies: one file per policy, each a dataclass that only computes a score.

A policy registers itself by being defined: every `Policy` subclass in a module of this package, with its
own `name`, is in `registry()` (the package imports each of its modules, so a new policy is its file and
its `conf/policy/<name>.yaml`, nothing else). Its class is importable from `kvbench.policies` too.
"""

import importlib
import pkgutil

from kvbench.policies.base import SCHEDULES, Policy, ScoreStats


def _discover() -> dict[str, type[Policy]]:
    """Import every module of this package, then walk `Policy`'s subclasses defined in them."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    out, stack = {}, [Policy]
    while stack:
        cls = stack.pop()
        for sub in cls.__subclasses__():
            stack.append(sub)
            if sub.__module__.startswith(__name__ + ".") and "name" in vars(sub):  # not a test's subclass
                out[sub.name] = sub
    return dict(sorted(out.items()))


_REGISTRY = _discover()
globals().update({cls.__name__: cls for cls in _REGISTRY.values()})  # `from kvbench.policies import H2O`

__all__ = ["SCHEDULES", "Policy", "ScoreStats", "registry", *sorted(cls.__name__ for cls in _REGISTRY.values())]


def registry() -> dict[str, type[Policy]]:
    """Policy name -> class, for every policy defined in this package (sorted by name)."""
    return dict(_REGISTRY)
