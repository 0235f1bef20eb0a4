"""Every job of a sweep composed as Hydra composes it, each distinct choice of config groups once.

Hydra composes a job in two phases: the defaults list (the config groups and files the job's overrides choose)
is merged into one config, then the job's value overrides (`policy.kv_size=64`, `++policy.x=1`, `~key`) are
applied to it in order (`ConfigLoaderImpl._apply_overrides_to_config`). In a sweep, most jobs differ only in
values (`policy.compression_ratio=0.25,0.5,...`), so the first phase is the same for many of them: it is done
once per distinct rest of the command line, and each job applies its dotted value overrides to a copy. A
600-job grid (12 tasks x 6 policies x 4 ratios x 2 schedules) then composes 72 times instead of 600; the
preflight (kvbench.cli) composes every job of a sweep before any runs, so this is its start-up time.

Only dotted keys outside `hydra` (`group.key=value`, with `+`, `++` or `~`) are applied to a copy; every other
override (a group choice, a top-level key, a `hydra/...` choice) is part of the composition. A job where a
dotted key lies under a top-level key another value override of the job replaces (`gen=... gen.x=1`) is
composed whole: order matters there, as it does not between a group choice and a value. `tests/config/test_sweep_compose.py` checks the result equals Hydra's own compose, job by job.
"""

from __future__ import annotations

import copy

from hydra import compose
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _applied_after(override: str) -> bool:
    """A dotted value override outside `hydra`: applicable to the composed config."""
    key = _key(override)
    return "." in key and "/" not in key and "@" not in key and not key.startswith("hydra")


def compose_each(config_name: str, jobs: list[list[str]], groups: set[str]) -> list:
    """The config of every job (a list of overrides each), equal to `hydra.compose(config_name, job)`; needs an
    initialized Hydra (`initialize_config_dir`), as `compose` does. `groups`: the top-level config groups."""
    parser = OverridesParser.create()
    bases: dict[tuple[str, ...], object] = {}
    out = []
    for job in jobs:
        job = list(job)
        later = [o for o in job if _applied_after(o)]
        rest = tuple(o for o in job if not _applied_after(o))
        if {_key(o).split(".")[0] for o in later} & {_key(o) for o in rest} - groups:  # a node, a key under it
            out.append(compose(config_name=config_name, overrides=job))
            continue
        if rest not in bases:
            bases[rest] = compose(config_name=config_name, overrides=list(rest))
        cfg = copy.deepcopy(bases[rest])
        ConfigLoaderImpl._apply_overrides_to_config(parser.parse_overrides(later), cfg)
        out.append(cfg)
    return out
