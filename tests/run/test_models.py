"""kvbench.run.models: a process keeps the model of its last run for the next run of the same model (a
sweep loads it once), only one at a time; a memory limit below the weights is bad input, not a run."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from kvbench import memory
from kvbench.config import CONF_DIR
from kvbench.run import models


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=["model=tiny-llama", "device=cpu", *overrides])


def test_the_same_model_is_loaded_once_and_only_one_is_kept():
    a = models.load_model(_cfg())
    assert models.load_model(_cfg("seed=5", "policy=h2o")) is a  # run keys that are not the model's
    b = models.load_model(_cfg("model.seed=1"))
    assert b is not a and list(models._models.values()) == [b]


def test_a_limit_below_the_weights_is_refused_by_its_key():
    weights = models.load_model(_cfg()).weights_bytes
    with pytest.raises(memory.ModelDoesNotFit, match="memory.limit_gb"):
        models.load_within(_cfg(), memory.MemoryLimit(weights / 2 / memory.GiB))
    assert models.load_within(_cfg(), memory.MemoryLimit(weights * 2 / memory.GiB)) is models.load_model(_cfg())
