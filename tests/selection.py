"""`--policy NAME` and `--arch ARCH`: run one policy's (one tiny model family's) rows of the tests given.

A test parametrised over the registered policies (a parameter that is a policy's name, a Policy, or a configuration
matrix row's `policy`) runs for NAME only: its rows for other policies are deselected, and so is the whole test
when it has no row of NAME (a hand-picked list of other policies). Likewise a test parametrised over the tiny
families (`FAMILY_ARCHS`, the family matrix) runs for ARCH only, matched exactly (`qwen2` is not `qwen2-window`,
where `-k qwen2` takes both). Every other test of the files given runs as usual: the checks that read a whole
registry (the docs tables, the cover of the configuration matrix) are the new policy's or family's checks too.
`make check-policy NAME=...` and `make check-family ARCH=...` (docs/contributing.md) give the files.
"""

from __future__ import annotations

from collections import defaultdict


def add_options(parser) -> None:
    group = parser.getgroup("kvbench")
    group.addoption("--policy", metavar="NAME", help="run the rows of this registered policy only, of tests "
                    "parametrised over policies (tests/selection.py)")
    group.addoption("--arch", metavar="ARCH", help="run the rows of this tiny family only (FAMILY_ARCHS), of tests "
                    "parametrised over families (tests/selection.py)")


def _policy_names(value, depth: int = 0):
    """The registered policies one parameter value names: a name, a Policy, a matrix row (`.policy`), in a tuple."""
    from kvbench.policies import Policy, registry

    if isinstance(value, str):
        if value in registry():
            yield value
    elif isinstance(value, Policy):
        yield value.name
    elif isinstance(value, (tuple, list)) and depth < 2:
        for v in value:
            yield from _policy_names(v, depth + 1)
    elif isinstance(getattr(value, "policy", None), str) and value.policy in registry():
        yield value.policy


def _arch_names(value, depth: int = 0):
    from kvbench.models.tiny import FAMILY_ARCHS

    if isinstance(value, str) and value in FAMILY_ARCHS:
        yield value
    elif isinstance(value, (tuple, list)) and depth < 2:
        for v in value:
            yield from _arch_names(v, depth + 1)


def _keep(items, chosen: str, names) -> tuple[list, list]:
    """(kept, deselected): a test with a row naming one of the kind keeps its rows naming `chosen` only."""
    rows = {}
    by_test = defaultdict(list)
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        rows[item.nodeid] = {n for v in params.values() for n in names(v)}
        by_test[(item.path, getattr(item, "originalname", item.name), item.cls)].append(item)
    kept, dropped = [], []
    for group in by_test.values():
        over_kind = any(rows[i.nodeid] for i in group)
        for item in group:
            (kept if not over_kind or chosen in rows[item.nodeid] else dropped).append(item)
    order = {id(i): k for k, i in enumerate(items)}
    return sorted(kept, key=lambda i: order[id(i)]), dropped


def select(config, items) -> None:
    import pytest

    for option, universe, names in (("policy", _registered, _policy_names), ("arch", _archs, _arch_names)):
        chosen = config.getoption(option)
        if not chosen:
            continue
        if chosen not in universe():
            raise pytest.UsageError(f"--{option} {chosen}: not one of {', '.join(sorted(universe()))}")
        kept, dropped = _keep(items, chosen, names)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept


def _registered():
    from kvbench.policies import registry

    return registry()


def _archs():
    from kvbench.models.tiny import FAMILY_ARCHS

    return FAMILY_ARCHS
