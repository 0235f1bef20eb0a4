"""kvbench.config.validate: `check_config` never changes its config; `prepare` (presets, then the checks)
accepts and refuses configs with presets by the same lines as the former `validate`.

The expected lines are literals (the former module's messages, checked against it: they pass on the commit
before the split with `validate` in place of `prepare`), not a call of the new code."""

from __future__ import annotations

import copy

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from kvbench import config
from kvbench.config import CONF_DIR
from kvbench.errors import ConfigError

TINY = ("model=tiny-llama", "task.n_samples=1", "task.context_tokens=16", "gen.max_new_tokens=4")
OPENVINO = (*TINY, "mode=serve", "policy=h2o", "serve.eviction=openvino")


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _prepared_line(*overrides) -> str | None:
    """The line `prepare` refuses the config with (the deprecated `validate` where prepare is not yet)."""
    try:
        config.prepare(_cfg(*overrides))
    except ConfigError as e:
        return str(e)
    return None


@pytest.mark.parametrize("overrides", [OPENVINO, (*OPENVINO, "policy.kv_size=100"), (*TINY, "policy=h2o"),
                                       (*TINY, "serve.eviction=openvino", "policy=h2o")])
def test_check_config_never_changes_its_config(overrides):
    cfg = _cfg(*overrides)
    before = copy.deepcopy(OmegaConf.to_container(cfg))
    try:
        config.check_config(cfg)
    except ConfigError:
        pass
    assert OmegaConf.to_container(cfg) == before


def test_prepare_applies_the_preset_and_check_config_judges_it_as_it_will_run():
    cfg = _cfg(*OPENVINO)
    config.check_config(cfg)  # accepted as it will run, though its own policy.kv_size is still h2o's 256
    assert cfg.policy.kv_size == 256 and cfg.serve.block_score == "sum"
    config.prepare(cfg)
    assert (cfg.policy.kv_size, cfg.policy.protect_first, cfg.policy.protect_recent, cfg.serve.block_score) == (
        672, 32, 128, "norm_sum")
    once = OmegaConf.to_container(cfg)
    config.prepare(cfg)  # idempotent
    assert OmegaConf.to_container(cfg) == once


@pytest.mark.parametrize("overrides,line", [
    (OPENVINO, None),
    ((*OPENVINO, "policy.kv_size=672", "policy.protect_first=32"), None),  # already the preset's values
    ((*OPENVINO, "policy.kv_size=100"),
     "policy.kv_size=100: is set by serve.eviction=openvino (to 672): leave it at policy=h2o's default"),
    ((*OPENVINO, "serve.block_score=sum"), None),
    ((*OPENVINO, "policy.kv_ratio=0.5"), "policy.kv_ratio=0.5: serve.eviction=openvino sets kv_size"),
    ((*TINY, "policy=h2o", "serve.eviction=openvino"),
     "serve.eviction=openvino: is a serving-mode preset: use it with mode=serve"),
    ((*TINY, "mode=serve", "policy=tova", "serve.eviction=openvino"),
     "serve.eviction=openvino: openvino scores by accumulated attention: use it with policy=h2o"),
    # several faults: the first in the checks' order, as before (the preset's refusal is not first)
    ((*TINY, "policy=h2o", "serve.eviction=openvino", "batch_size=0"), "batch_size=0: must be a positive integer"),
    ((*OPENVINO, "policy.kv_size=100", "serve.block_size=0"), "serve.block_size=0: must be a positive integer"),
    ((*OPENVINO, "policy.kv_size=100", "serve.eviction=vllm"),
     "serve.eviction=vllm: must be policy or one of openvino"),
    # the preset's kv_size is what later checks see: 672 is not a multiple of 64
    ((*OPENVINO, "serve.block_size=64"), "serve.block_size=64: must divide policy.kv_size=672 (eviction is by "
                                         "whole blocks)"),
])
def test_presets_are_accepted_and_refused_as_before(overrides, line):
    assert _prepared_line(*overrides) == line
    if line is not None:  # the pure check refuses by the same line, leaving the config as it was
        cfg = _cfg(*overrides)
        with pytest.raises(ConfigError) as e:
            config.check_config(cfg)
        assert str(e.value) == line


def test_a_bad_dtype_is_refused_by_the_pure_check_whatever_was_loaded_before():
    """model.dtype is checked on the config itself: the preflight's config cache ignores the dtype (it does not
    change the tokenizer), so a bad dtype after a good one in one process (a multirun) used to pass until load."""
    from kvbench.config.validate import DTYPE_NAMES
    from kvbench.models.loaded import DTYPES

    assert DTYPE_NAMES == tuple(DTYPES)  # the names the loaders accept, without importing torch in the check
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        good = compose("config", overrides=["model=tiny-llama", "model.dtype=float32"])
        bad = compose("config", overrides=["model=tiny-llama", "model.dtype=float17"])
    config.check_config(good)
    with pytest.raises(ConfigError) as e:
        config.check_config(bad)
    assert e.value.key == "model.dtype"
