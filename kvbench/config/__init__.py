"""A run's configuration: its schema, presets, checks, identity, and the preflight, before any model loads.

One idea per module (imports go one way: schema <- groups, candidates, presets <- checks; run_identity and
prompts beside them; preflight last):
- `schema`: the structured config (`RootConfig`, registered as `kvbench_schema`), CONF_DIR, the modes;
- `groups`: the policy and task nodes instantiated, and which policy keys a policy uses;
- `candidates`: the batch sizes the max-batch search may try;
- `presets`: values that set other values (`serve.eviction`); `apply_presets` is the one that changes a config;
- `checks` (+ `serve_checks`): `check_config`, every check that needs no model, pure; `prepare` = presets + checks;
- `run_identity`: what a run computes (`identity`) and its `config_hash`, with the rules that keep old
  records' hashes;
- `prompts`: the prompts' token lengths from the tokenizer alone (`prompt_token_lengths`);
- `preflight`: what a run needs beyond its config (model files, prompts, pool, results folder); not imported
  here, so `import kvbench.config` stays light: `from kvbench.config.preflight import check_run`.

The names below are re-exported so `from kvbench.config import X` keeps working for every X the former
single module had.
"""

from kvbench.config.candidates import DIVISORS_OF_960, search_candidates
from kvbench.config.groups import build_policy, build_task, drop_inapplicable, policy_defaults, policy_key_use
from kvbench.config.presets import H2O_DEFAULTS, SERVE_PRESETS, apply_presets, preset_refusal, with_presets
from kvbench.config.prompt_lengths import prompt_token_lengths
from kvbench.config.run_identity import NON_IDENTITY, config_hash, device_kind, identity, record_hash
from kvbench.config.schema import (
    CONF_DIR,
    MODES,
    SERVE_ATTENTION,
    SERVE_MODES,
    DataConfig,
    GenConfig,
    MemoryConfig,
    OutputConfig,
    PlanConfig,
    ReproduceConfig,
    RootConfig,
    SearchConfig,
    ServeConfig,
    register_schema,
)
from kvbench.config.validate import check_config, prepare

__all__ = [
    "CONF_DIR", "DIVISORS_OF_960", "H2O_DEFAULTS", "MODES", "NON_IDENTITY", "SERVE_ATTENTION", "SERVE_MODES",
    "SERVE_PRESETS", "DataConfig", "GenConfig", "MemoryConfig", "OutputConfig", "PlanConfig", "ReproduceConfig",
    "RootConfig", "SearchConfig", "ServeConfig", "apply_presets", "build_policy", "build_task", "check_config",
    "config_hash", "device_kind", "drop_inapplicable", "identity", "policy_defaults", "policy_key_use",
    "prepare", "preset_refusal", "prompt_token_lengths", "record_hash", "register_schema", "search_candidates",
    "with_presets",
]
