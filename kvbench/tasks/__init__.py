"""Tasks: one small class per task (prompt building, answer extraction, scoring).

A task registers itself by being defined: every `Task` subclass in a module of this package with its own
`name` (and not marked `abstract`, as the RULER base is) is in `TASKS` (the package imports each of its
modules, so a new task is its file and its `conf/task/<name>.yaml`, nothing else). The report reads a
task's `metric` from here.
"""

from kvbench.registry import discover
from kvbench.tasks.task import Sample, Task

TASKS: dict[str, type[Task]] = discover(__name__, __path__, Task)  # name -> class
globals().update({cls.__name__: cls for cls in TASKS.values()})  # `from kvbench.tasks import CNNDM`

from kvbench.tasks.ruler import RULER_TASKS, Ruler  # noqa: E402  (RULER_TASKS: name -> class, the RULER tasks alone)

__all__ = ["Sample", "Task", "Ruler", "RULER_TASKS", "TASKS", *sorted(cls.__name__ for cls in TASKS.values())]
