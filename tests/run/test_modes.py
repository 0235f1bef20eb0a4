"""kvbench.run.modes: every mode the config accepts has a function, all with the one signature the life
cycle calls; the modes run without a model are modes."""

from __future__ import annotations

import inspect

from kvbench.config import MODES as ACCEPTED
from kvbench.run.modes import MODES, NO_MODEL

SIGNATURE = ["cfg", "record", "lm", "policy", "task", "samples", "ids"]


def test_every_accepted_mode_has_a_function():
    assert set(MODES) == set(ACCEPTED) and set(NO_MODEL) <= set(MODES)


def test_every_mode_takes_the_same_arguments():
    for mode, fn in MODES.items():
        params = list(inspect.signature(fn).parameters)
        assert params[:7] == SIGNATURE and len(params) == 8, (mode, params)  # the 8th: the memory limit
