"""Presets: one config value that sets several others, applied to the config itself so a record shows what ran.

`gen.max_new_tokens=null` (the default) is the task's own generation length: RULER's per task (128 niah, 30 vt,
120 cwe, 50 fwe, 32 qa: the task class's `default_new_tokens`), else DEFAULT_NEW_TOKENS (32); resolved once
here, so every consumer (the engine, the memory account, the planner, the search, serve, the lm-eval adapter,
the record) reads an integer, and a record's config and `max_new_tokens` state the length generated. A value
given explicitly is kept (a RULER task records it as a departure when it is not RULER's).

`gen.kv_quant_group=null` (the default) is the quantized cache's group: in mode=serve with a quantized pool the page,
`serve.block_size` (a page is its keys' group, so the two must be equal: the default pairs them), else 32 (KIVI's;
what records written before the default was derived hold). A value given explicitly is kept (and checked).

`serve.eviction=<preset>` (the serve modes): OpenVINO GenAI's cache eviction defaults, a
start area of 32 tokens, an evictable area of 512 and a recent area of 128, NORM_SUM of accumulated attention,
eviction once the prompt is processed. It needs policy=h2o (accumulated attention) with the keys it sets at
h2o's own defaults (or already at the preset's values: applying is idempotent).

Two functions, so that only one of them changes a config:
- `preset_refusal(cfg)` (pure): the ConfigError a preset that cannot apply gives, or None;
- `apply_presets(cfg)` (mutates cfg, returns nothing): sets the keys of a preset that applies; one that
  cannot apply is left alone, for kvbench.config.validate to refuse in its turn (so a config with several
  faults is refused by the same first line whether or not its presets were applied first).
`with_presets(cfg)` is the pure way to see a config as it will run: a copy with its presets applied.
"""

from __future__ import annotations

import copy

from omegaconf import DictConfig

from kvbench.config.schema import SERVE_MODES
from kvbench.errors import ConfigError

DEFAULT_NEW_TOKENS = 32  # gen.max_new_tokens of a task that publishes no generation length
# serve.eviction presets: the policy keys and serve keys each sets
SERVE_PRESETS = {"openvino": {"policy": {"kv_size": 32 + 512 + 128, "protect_first": 32, "protect_recent": 128,
                                         "schedule": "decode_only"}, "serve": {"block_score": "norm_sum"}}}
# policy=h2o's defaults (conf/policy/h2o.yaml) and serve.block_score's, for the keys a preset may set
H2O_DEFAULTS = {"kv_size": 256, "protect_first": 0, "protect_recent": None, "schedule": "decode_only",
                "block_score": "sum", "kv_ratio": None}


def preset_refusal(cfg: DictConfig) -> ConfigError | None:
    """Why `serve.eviction`'s preset cannot apply to cfg (None: it can, or there is none). Never changes cfg;
    an unknown `serve.eviction` is refused by the checks, not here."""
    name = cfg.serve.eviction
    if name == "policy" or name not in SERVE_PRESETS:
        return None
    if cfg.mode not in SERVE_MODES:
        return ConfigError("serve.eviction", "is a serving-mode preset: use it with mode=serve", name)
    if not str(cfg.policy.get("_target_", "")).endswith(".H2O"):
        return ConfigError("serve.eviction", f"{name} scores by accumulated attention: use it with policy=h2o", name)
    for group, values in SERVE_PRESETS[name].items():
        for key, value in values.items():
            now = cfg[group].get(key)
            if now != value and now != H2O_DEFAULTS.get(key):
                return ConfigError(f"{group}.{key}", f"is set by serve.eviction={name} (to {value}): leave it at "
                                   "policy=h2o's default", now)
    for key in ("kv_ratio", "compression_ratio"):
        if cfg.policy.get(key) is not None:
            return ConfigError(f"policy.{key}", f"serve.eviction={name} sets kv_size", cfg.policy[key])
    return None


def task_new_tokens(cfg: DictConfig) -> int:
    """gen.max_new_tokens=null resolved: the task class's published length (`default_new_tokens` of the node's
    `_target_`), else DEFAULT_NEW_TOKENS. A target that is not a kvbench task (refused by the checks) gets the
    default."""
    from hydra.utils import get_class

    try:
        cls = get_class(str(cfg.task.get("_target_")))
        own = cls.default_new_tokens(cfg.task)
    except Exception:  # not a class, or not a Task: kvbench.config.validate refuses it in its turn
        own = None
    return own if isinstance(own, int) and own > 0 else DEFAULT_NEW_TOKENS


def quant_group(cfg: DictConfig) -> int:
    """gen.kv_quant_group=null resolved: serve.block_size for a quantized pool (mode=serve), else 32."""
    from kvbench.quant.qconfig import DEFAULT_GROUP

    quantized = cfg.gen.get("kv_cache_dtype", "auto") != "auto"
    return cfg.serve.block_size if quantized and cfg.mode == "serve" else DEFAULT_GROUP


def _pending(cfg: DictConfig) -> bool:
    """Whether a preset would change cfg (gen.max_new_tokens or gen.kv_quant_group to resolve, or a serve.eviction
    preset to apply)."""
    name = cfg.serve.eviction
    return (cfg.gen.max_new_tokens is None or ("kv_quant_group" in cfg.gen and cfg.gen.kv_quant_group is None)
            or (name in SERVE_PRESETS and preset_refusal(cfg) is None))


def apply_presets(cfg: DictConfig) -> None:
    """Set, in place, gen.max_new_tokens and gen.kv_quant_group when null (`task_new_tokens`, `quant_group`), and the
    keys `serve.eviction`'s preset names, when it applies (`preset_refusal` is None); otherwise leave cfg unchanged.
    Idempotent."""
    if cfg.gen.max_new_tokens is None:
        cfg.gen.max_new_tokens = task_new_tokens(cfg)
    if "kv_quant_group" in cfg.gen and cfg.gen.kv_quant_group is None:
        cfg.gen.kv_quant_group = quant_group(cfg)
    name = cfg.serve.eviction
    if name not in SERVE_PRESETS or preset_refusal(cfg) is not None:
        return
    for group, values in SERVE_PRESETS[name].items():
        for key, value in values.items():
            cfg[group][key] = value


def with_presets(cfg: DictConfig) -> DictConfig:
    """cfg as it will run: a copy with its presets applied, or cfg itself when none applies (never changed)."""
    if not _pending(cfg):
        return cfg
    out = copy.deepcopy(cfg)
    apply_presets(out)
    return out
