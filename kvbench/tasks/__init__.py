"""Tasks: one small class per task (prompt building, answer extraction, scoring)."""

from kvbench.tasks.base import Sample, Task
from kvbench.tasks.cnndm import CNNDM
from kvbench.tasks.gsm8k import GSM8K
from kvbench.tasks.narrativeqa import NarrativeQA
from kvbench.tasks.passkey import Passkey
from kvbench.tasks.ruler import TASKS as RULER_TASKS
from kvbench.tasks.ruler import Ruler

TASKS = {t.name: t for t in (CNNDM, GSM8K, NarrativeQA, Passkey, *RULER_TASKS.values())}  # name -> class

__all__ = ["Sample", "Task", "CNNDM", "GSM8K", "NarrativeQA", "Passkey", "Ruler", "RULER_TASKS", "TASKS"]
