"""Tasks: one small class per task (prompt building, answer extraction, scoring).

A task registers itself by being defined: every `Task` subclass in a module of this package with its own
`name` (and not marked `abstract`, as the RULER base is) is in `TASKS` (the package imports each of its
modules, so a new task is its file and its `conf/task/<name>.yaml`, nothing else). The report reads a
task's `metric` from here.
"""

import importlib
import pkgutil

from kvbench.tasks.base import Sample, Task


def _discover() -> dict[str, type[Task]]:
    """Import every module of this package, then walk `Task`'s subclasses defined in them."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    out, stack = {}, [Task]
    while stack:
        cls = stack.pop()
        for sub in cls.__subclasses__():
            stack.append(sub)
            own = vars(sub)
            if sub.__module__.startswith(__name__ + ".") and "name" in own and not own.get("abstract", False):
                out[sub.name] = sub
    return dict(sorted(out.items()))


TASKS = _discover()  # name -> class
globals().update({cls.__name__: cls for cls in TASKS.values()})  # `from kvbench.tasks import CNNDM`

from kvbench.tasks.ruler import TASKS as RULER_TASKS  # noqa: E402  (the RULER tasks, for the needle sweeps)
from kvbench.tasks.ruler import Ruler  # noqa: E402

__all__ = ["Sample", "Task", "Ruler", "RULER_TASKS", "TASKS", *sorted(cls.__name__ for cls in TASKS.values())]
