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
        cfg = _cfg(*overrides, "gen.max_new_tokens=32", "gen.kv_quant_group=32")  # given: nothing to resolve
        before = OmegaConf.to_container(cfg)
        apply_presets(cfg)
        assert OmegaConf.to_container(cfg) == before and with_presets(cfg) is cfg
        assert preset_refusal(cfg) is not None


def test_no_preset_no_change():
    cfg = _cfg("mode=serve", "policy=h2o", "gen.max_new_tokens=32", "gen.kv_quant_group=32")
    assert preset_refusal(cfg) is None and with_presets(cfg) is cfg


# RULER's tokens_to_generate per task (NVIDIA/RULER scripts/data/synthetic/constants.py), written out here
RULER_LENGTHS = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}


def test_null_max_new_tokens_is_the_tasks_own_length():
    """gen.max_new_tokens=null (the default): each RULER task generates RULER's length, every other task 32;
    resolved once, in place, so the record's config and every consumer read an integer."""
    from kvbench.conf import options
    from kvbench.config import config_hash

    assert _cfg().gen.max_new_tokens is None
    for name in options("task"):
        cfg = _cfg(f"task={name}")
        hash_before = config_hash(cfg)
        apply_presets(cfg)
        kind = name.split("_")[0]
        assert cfg.gen.max_new_tokens == RULER_LENGTHS.get(kind, RULER_LENGTHS.get(name, 32)), name
        assert config_hash(cfg) == hash_before  # the identity is the length that runs, resolved or not
        apply_presets(cfg)  # idempotent
        assert cfg.gen.max_new_tokens == RULER_LENGTHS.get(kind, RULER_LENGTHS.get(name, 32))
    given = _cfg("task=niah_single_3", "gen.max_new_tokens=48")
    assert with_presets(given).gen.max_new_tokens == 48  # given explicitly: kept
    own = _cfg("task=cwe", "task.tokens_to_generate=64")
    assert with_presets(own).gen.max_new_tokens == 64  # the task's own tokens_to_generate
    assert with_presets(_cfg("task=passkey")).gen.max_new_tokens == 32
    plain = _cfg("task=cnndm")
    assert config_hash(plain) == config_hash(_cfg("task=cnndm", "gen.max_new_tokens=32"))  # old records' identity
