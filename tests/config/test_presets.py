"""kvbench.config.presets: only `apply_presets` changes a config, and only when its preset applies."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from kvbench.config import CONF_DIR
from kvbench.config.presets import apply_presets, preset_refusal, with_presets


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=["model=tiny-llama", *overrides])


def test_a_preset_that_applies_sets_its_keys():
    cfg = _cfg("mode=serve", "policy=h2o", "serve.eviction=openvino")
    view = with_presets(cfg)
    assert view is not cfg and view.policy.kv_size == 672 and cfg.policy.kv_size == 256
    assert preset_refusal(cfg) is None and preset_refusal(view) is None
    apply_presets(cfg)
    assert OmegaConf.to_container(cfg) == OmegaConf.to_container(view)
    assert cfg.policy.schedule == "decode_only" and cfg.serve.block_score == "norm_sum"


def test_a_preset_that_cannot_apply_leaves_the_config_for_the_checks():
    for overrides in (("policy=h2o", "serve.eviction=openvino"),  # not a serve mode
                      ("mode=serve", "policy=h2o", "serve.eviction=openvino", "policy.protect_recent=7")):
        cfg = _cfg(*overrides)
        before = OmegaConf.to_container(cfg)
        apply_presets(cfg)
        assert OmegaConf.to_container(cfg) == before and with_presets(cfg) is cfg
        assert preset_refusal(cfg) is not None


def test_no_preset_no_change():
    cfg = _cfg("mode=serve", "policy=h2o")
    assert preset_refusal(cfg) is None and with_presets(cfg) is cfg
