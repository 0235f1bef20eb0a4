"""Hydra configs of kvbench (shipped inside the package as kvbench.conf).

`load_option(group, name)`: one option of a config group as Hydra composes it (its file's `defaults`
entries merged first, then its own keys), without composing the whole config: a policy's file states
only what differs from the keys every policy shares (`base/policy.yaml`).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parent


def load_option(group: str, name: str) -> DictConfig:
    """conf/<group>/<name>.yaml with its defaults list applied (entries `/path@_here_`, then `_self_`)."""
    node = OmegaConf.load(CONF_DIR / group / f"{name}.yaml")
    defaults = list(node.pop("defaults", []))
    if defaults and defaults[-1] != "_self_":
        raise ValueError(f"conf/{group}/{name}.yaml: its defaults list must end with _self_")
    out = OmegaConf.create()
    for entry in defaults[:-1]:
        path, _, package = str(entry).partition("@")
        if package != "_here_" or not path.startswith("/"):
            raise ValueError(f"conf/{group}/{name}.yaml: only `/path@_here_` defaults are supported, not {entry}")
        out = OmegaConf.merge(out, OmegaConf.load(CONF_DIR / f"{path[1:]}.yaml"))
    return OmegaConf.merge(out, node)


def options(group: str) -> list[str]:
    """The options of a config group: its files' names, sorted."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
