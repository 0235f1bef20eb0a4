"""The policy and task groups of a config: instantiating them, and which policy keys a policy uses.

A policy or task node is a `_target_` config that instantiates straight into its dataclass (whose own
checks name a bad override). A sweep over several policies shares its `policy.<key>=...` overrides, so each
job's policy must be told apart from the keys it has not got or does not use (`policy_key_use`), and a
job's config reset to its policy's own for those (`drop_inapplicable`), so that its identity is the one the
same policy gets on its own.
"""

from __future__ import annotations

import functools

from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from kvbench import conf


def build_policy(cfg: DictConfig):
    """The run's policy object (kvbench.policies), from `cfg.policy`."""
    return instantiate(cfg.policy, _convert_="all")


def build_task(cfg: DictConfig):
    """The run's task object (kvbench.tasks), from `cfg.task`, reading its data from `data.dir`."""
    return instantiate(cfg.task, _convert_="all", data_dir=cfg.data.dir)


@functools.lru_cache(maxsize=1)
def policy_defaults() -> dict[str, dict]:
    """`_target_` -> the policy's own config (conf/policy/<name>.yaml): the keys it has and their defaults."""
    out = {}
    for name in conf.options("policy"):
        own = OmegaConf.to_container(conf.load_option("policy", name))
        out[own["_target_"]] = own
    return out


def policy_key_use(cfg: DictConfig, key: str) -> str:
    """How the run's policy takes its key `policy.<key>`: "applies" (a key the policy uses), "ignored" (one it
    has not got, or one of its `inert_keys` set away from its default) or "default" (inert, at its default)."""
    target = cfg.policy.get("_target_")
    own = policy_defaults().get(target)
    if own is None:  # a policy kvbench does not ship: every key is its own
        return "applies"
    if key not in own:
        return "ignored"
    if key not in getattr(get_class(target), "inert_keys", ()):
        return "applies"
    return "default" if cfg.policy.get(key) == own[key] else "ignored"


def drop_inapplicable(cfg: DictConfig) -> list[str]:
    """Reset, in place, every policy key the run's policy does not use (`policy_key_use` "ignored") to the
    policy's own default (a key it has not got is removed), and the quantized cache's knobs set in a run that
    quantizes nothing (kvbench.quant.qconfig.unused_knobs) to theirs; returns them, `policy.<key>` sorted, then
    `gen.<key>`.

    A sweep over several policies applies its policy keys to each policy that uses them only: full's run then
    has full's own config, so its identity is that of `policy=full` (one run for any kv_size of the sweep).
    """
    from kvbench.config.schema import GenConfig
    from kvbench.quant.qconfig import unused_knobs

    ignored = sorted(k for k in cfg.policy if k != "_target_" and policy_key_use(cfg, k) == "ignored")
    if ignored:
        own = policy_defaults()[cfg.policy._target_]
        with open_dict(cfg.policy):
            for k in ignored:
                if k in own:
                    cfg.policy[k] = own[k]
                else:
                    del cfg.policy[k]
    unused = unused_knobs(cfg.gen)  # the quantized cache's knobs in a job whose cache is not quantized
    for key in unused:
        name = key.split(".")[1]
        cfg.gen[name] = getattr(GenConfig, name)  # its default
    return [f"policy.{k}" for k in ignored] + unused
