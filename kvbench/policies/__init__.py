"""Eviction policies: one file per policy, each a dataclass that only computes a score.

A policy registers itself by being defined: every `Policy` subclass in a module of this package, with its
own `name`, is in `registry()` (the package imports each of its modules, so a new policy is its file and
its `conf/policy/<name>.yaml`, nothing else). Its class is importable from `kvbench.policies` too.
"""

from kvbench.policies.policy import SCHEDULES, Policy, ScoreContext
from kvbench.registry import discover

_REGISTRY: dict[str, type[Policy]] = discover(__name__, __path__, Policy)
globals().update({cls.__name__: cls for cls in _REGISTRY.values()})  # `from kvbench.policies import H2O`

__all__ = ["SCHEDULES", "Policy", "ScoreContext", "registry", *sorted(cls.__name__ for cls in _REGISTRY.values())]


def registry() -> dict[str, type[Policy]]:
    """Policy name -> class, for every policy defined in this package (sorted by name)."""
    return dict(_REGISTRY)
