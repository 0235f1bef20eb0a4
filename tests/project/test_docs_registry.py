"""The docs' tables of policies and tasks against the registries (issue 35): a new policy or task is its file
and its config; these tests then say which pages must name it, and check what the tables state about it.

Independent sides: the pages are written by hand, the registries come from the code (kvbench.policies.registry,
kvbench.tasks.TASKS) and the shipped configs (conf/policy, conf/task, composed with kvbench.conf.load_option).
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from kvbench.conf import CONF_DIR, load_option, options
from kvbench.policies import registry
from kvbench.report.rows import METRICS
from kvbench.tasks import TASKS

ROOT = Path(__file__).resolve().parents[2]
COMMON = ("_target_", *OmegaConf.load(CONF_DIR / "base" / "policy.yaml"))  # the keys every policy shares


def table(page: str, header: str) -> list[list[str]]:
    """The rows (cells, stripped) of the markdown table of `page` whose header row starts with `header`."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(header))
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", ln.strip().strip("|"))])
    return rows


def names(cell: str) -> list[str]:
    return re.findall(r"`([\w*]+)`", cell)


def row(page: str, header: str, key: str) -> str:
    return next(r[1] for r in table(page, header) if r[0] == key)


def test_every_policy_and_task_has_a_config_and_a_class():
    assert options("policy") == sorted(registry())
    assert options("task") == sorted(TASKS)
    for name, cls in TASKS.items():
        assert load_option("task", name)["_target_"] == f"{cls.__module__}.{cls.__name__}"


@pytest.mark.parametrize("page,header", [("README.md", "| `policy=` |"), ("docs/policies.md", "| policy | score")])
def test_policy_tables_name_every_policy(page, header):
    listed = [names(r[0])[0] for r in table(page, header)]
    assert sorted(listed) == sorted(registry()), f"{page}: add {set(registry()) - set(listed)}, drop {set(listed) - set(registry())}"


@pytest.mark.parametrize("page,header,key", [("docs/cli.md", "| group / key |", "`policy=`"),
                                             ("docs/contract.md", "| override |", "`policy=NAME`")])
def test_policy_lists_name_every_policy(page, header, key):
    listed = names(row(page, header, key))
    assert sorted(listed) == sorted(registry()), f"{page}: add {set(registry()) - set(listed)}, drop {set(listed) - set(registry())}"


def test_policies_defaults_column_is_the_configs():
    """docs/policies.md's "kvbench's defaults": kv, p and the schedule as each policy's config composes them."""
    for cells in table("docs/policies.md", "| policy | score"):
        name, said = names(cells[0])[0], cells[2]
        cfg = load_option("policy", name)
        if name == "full" or said.startswith("as "):
            continue
        kv, p = re.search(r"kv (\d+)", said), re.search(r"p (\d+|= kv - 1)", said)
        assert int(kv[1]) == cfg.kv_size, name
        assert (cfg.evict_every is None) if p[1] == "= kv - 1" else int(p[1]) == cfg.evict_every, name
        assert cfg.schedule in said, name


def test_published_table_names_every_policy_with_a_published_method():
    """The table of published defaults: every policy that declares a departure (a published schedule or
    evict_every) and no other."""
    declared = sorted(n for n, c in registry().items() if c.published_schedule or c.published_evict_every)
    listed = sorted(names(r[0])[0] for r in table("docs/policies.md", "| policy | paper |"))
    assert listed == declared, f"docs/policies.md's published table: add {set(declared) - set(listed)}"


def test_cli_own_keys_row_is_the_configs():
    """docs/cli.md's per-policy keys ("snapkv, pyramidkv: `window`, ...; random: `seed`") are the keys each policy's
    config has beyond the shared ones."""
    said: dict[str, set[str]] = {}
    for part in row("docs/cli.md", "| group / key |", "`policy.*` (per policy)").split("; "):
        who, keys = part.split(":", 1)
        for name in who.split(", "):
            said.setdefault(name.strip(), set()).update(re.findall(r"`(\w+)", keys))
    own = {n: {k for k in load_option("policy", n) if k not in COMMON} for n in registry()}
    assert said == {n: k for n, k in own.items() if k}


def test_task_tables_name_every_task_and_its_metric():
    """docs/tasks.md's table covers every registered task (`niah_*` stands for several) and states its metric;
    docs/cli.md's `task=` row names every task too."""
    rows = table("docs/tasks.md", "| task | data |")
    for name, cls in TASKS.items():
        hits = [r for r in rows if any(fnmatch.fnmatch(name, pat) for pat in names(r[0]))]
        assert len(hits) == 1, f"docs/tasks.md's table: one row for {name} ({len(hits)} found)"
        assert cls.metric in hits[0][3] or METRICS.get(cls.metric, "?") in hits[0][3], (name, cls.metric)
    listed = names(row("docs/cli.md", "| group / key |", "`task=`"))
    assert all(any(fnmatch.fnmatch(n, pat) for pat in listed) for n in TASKS), listed


def test_every_accepted_family_is_in_the_docs_and_the_family_matrix():
    """docs/models.md's families table names every family the adapter accepts (kvbench.models.family.FAMILIES),
    and each has a tiny model the family matrix runs (llama and phi3, or an arch of FAMILY_ARCHS)."""
    from kvbench.models.family import FAMILIES
    from kvbench.models.tiny import FAMILY_ARCHS

    documented = {n for r in table("docs/models.md", "| family (`model_type`) |") for n in names(r[0])}
    assert documented == set(FAMILIES), f"docs/models.md's families: add {set(FAMILIES) - documented}"
    tiny = {"llama", "phi3", *(model_type for model_type, _ in FAMILY_ARCHS.values())}
    assert set(FAMILIES) <= tiny, set(FAMILIES) - tiny
