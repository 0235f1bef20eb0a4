"""Deprecated: kvbench.runner moved to the kvbench.run package (issue 35). Import from there.

This module only re-exports the old names so older code keeps importing; patching a name here does not
reach the code that uses it (patch it where it is looked up: see kvbench.run's docstring).
"""

from kvbench.config import build_policy, build_task  # noqa: F401
from kvbench.errors import OutOfMemory  # noqa: F401
from kvbench.memory import is_oom  # noqa: F401
from kvbench.run.life import run  # noqa: F401
from kvbench.run.models import load_model, load_within  # noqa: F401
from kvbench.run.modes import MODES, NO_MODEL, prompt_report  # noqa: F401
from kvbench.run.record import git_sha, memory_fields, new_record, task_extensions  # noqa: F401
from kvbench.run.signals import SIGNALS, TermGuard, Terminated  # noqa: F401
from kvbench.run.static import (  # noqa: F401
    clamp_batch_size,
    execute,
    question_tokens,
    run_static,
    search_batch_size,
    warmup_of,
)
from kvbench.run.store import RecordNotWritten, rescue_dir, save  # noqa: F401

find_batch_size = search_batch_size  # the old names (OWNERS.md's renames)
fit_batch_size = clamp_batch_size
