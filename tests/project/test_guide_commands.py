"""The contributing guide's checks select what they say (docs/contributing.md, issue 58).

`make check-policy NAME=...` runs one policy's rows of the tests a new policy joins (its config, its docs, its
reference rule, its rows of the configuration matrix, the preflight of every combination of it) and no other
policy's; `make check-family ARCH=...` runs one tiny family's rows of the family matrix, matched exactly (`qwen2`, not
`qwen2-window` as `-k qwen2` would), and the docs registry's families table (the guide's former command,
`pytest tests/models/test_family.py -k <arch> tests/project/test_docs_registry.py`, applied `-k` to both files and
ran no docs-registry test). Each command is the Makefile's own (`make -n`), collected by pytest in its own process;
the selection (tests/selection.py) is checked on hand-made rows first.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvbench.policies import Knorm, registry
from tests.selection import _arch_names, _keep, _policy_names

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "contributing.md"


def item(test: str, **params):
    """A collected test as tests/selection.py reads one: its node id, parameters, file, function, class."""
    shown = "-".join(getattr(v, "name", str(v)) for v in params.values())
    return SimpleNamespace(nodeid=f"t.py::{test}" + (f"[{shown}]" if params else ""), path="t.py", originalname=test,
                           name=test, cls=None, callspec=SimpleNamespace(params=params) if params else None)


def kept(items, chosen, names) -> list[str]:
    return [i.nodeid for i in _keep(items, chosen, names)[0]]


def test_the_selection_keeps_one_policys_and_one_familys_rows():
    row = SimpleNamespace(policy="knorm", model="tiny-llama")  # a configuration matrix row
    items = [item("by_name", name="h2o"), item("by_name", name="knorm"), item("plain"),
             item("by_policy", policy=Knorm()), item("by_row", combo=row), item("by_row", combo=SimpleNamespace(
                 policy="h2o", model="tiny-llama")), item("hand_picked", name="h2o"), item("cases", case=("knorm", {})),
             item("family", arch="qwen2"), item("family", arch="qwen2-window"), item("other", group="task")]
    assert kept(items, "knorm", _policy_names) == [
        "t.py::by_name[knorm]", "t.py::plain", "t.py::by_policy[knorm]", f"t.py::by_row[{row}]",
        "t.py::cases[('knorm', {})]", "t.py::family[qwen2]", "t.py::family[qwen2-window]", "t.py::other[task]"]
    assert kept(items, "qwen2", _arch_names) == [i.nodeid for i in items if "qwen2-window" not in i.nodeid]


def collected(target: str, var: str, value: str) -> list[str]:
    """The node ids the guide's `make TARGET VAR=value` runs: the Makefile's command (make -n), collected only."""
    assert f"make {target} {var}=" in GUIDE.read_text(), f"docs/contributing.md shows no `make {target} {var}=...`"
    venv = Path(sys.executable).parent.parent
    dry = subprocess.run(["make", "-n", "--no-print-directory", "-o", "install", target, f"{var}={value}",
                          f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip().splitlines()
    words = shlex.split(dry[-1])
    assert words[1:4] == ["-m", "pytest", "-q"], dry[-1]
    p = subprocess.run([sys.executable, *words[1:], "--collect-only", "-p", "no:randomly"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return [line for line in p.stdout.splitlines() if "::" in line]


def test_check_policy_runs_one_policys_checks():
    from tests.matrix_preflight import newest

    name = newest()[0]  # a new policy where there is one, else the newest the matrix's record holds
    ids = collected("check-policy", "NAME", name)
    rows = [i for i in ids if "::test_refused_up_front_or_a_true_record[" in i]
    assert rows and all(i.split("[", 1)[1].startswith(f"{name}-") for i in rows), rows  # its matrix rows only
    assert set(ids) - set(rows) == {
        f"tests/config/test_schema.py::test_every_option_composes[policy-{name}]",
        f"tests/project/test_docs_registry.py::test_every_policy_says_what_it_keeps_and_cites_its_paper[{name}]",
        "tests/project/test_docs_registry.py::test_policy_tables_cover_the_registry_and_state_the_published_settings",
        f"tests/policies/test_scored.py::test_every_registered_policy_matches_its_reference_rule[{name}]",
        f"tests/project/test_matrix_preflight.py::test_every_combination_of_the_newest_policy_agrees[{name}]"}
    assert name in registry()


def test_check_family_runs_one_familys_rows_and_the_docs_registry():
    ids = collected("check-family", "ARCH", "qwen2")
    assert "tests/models/test_family.py::test_full_cache_equals_hf_generate_float32[qwen2]" in ids
    assert ("tests/project/test_docs_registry.py::"
            "test_families_table_names_every_accepted_family_each_checked_in_the_family_matrix") in ids
    assert "tests/models/test_family.py::test_every_family_is_accepted_or_refused" in ids
    family_rows = [i for i in ids if "[" in i and "test_docs_registry" not in i]
    assert family_rows and all(i.split("[", 1)[1].split("]")[0].split("-")[0] == "qwen2" for i in family_rows), ids
    assert not [i for i in ids if "qwen2-window" in i], ids


@pytest.mark.parametrize("option", ["policy", "arch"])
def test_an_unknown_name_is_refused(option):
    from tests.selection import select

    config = SimpleNamespace(getoption=lambda name: "nonesuch" if name == option else None)
    with pytest.raises(pytest.UsageError, match=f"^--{option} nonesuch: not one of "):
        select(config, [item("plain")])
