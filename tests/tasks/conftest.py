"""Fixtures of the task tests: a data.dir holding tiny RULER data sets in the Hub's layout (tests.tasks.ruler_shards)."""

from __future__ import annotations

import pytest

from kvbench.tasks import RULER_TASKS
from tests.tasks import ruler_shards


@pytest.fixture(scope="session")
def shards(tmp_path_factory) -> str:
    """Essays, SQuAD v2, HotpotQA and kvpress's rows (3 a task at 4096) for RULER's 13 tasks."""
    return ruler_shards.mirror(tmp_path_factory.mktemp("ruler_data"), kvpress_tasks=sorted(RULER_TASKS))
