"""Tasks: one small class per task (prompt building, answer extraction, scoring)."""

from kvbench.tasks.base import Sample, Task
from kvbench.tasks.passkey import Passkey

__all__ = ["Sample", "Task", "Passkey"]
