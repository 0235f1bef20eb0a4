"""docs/compare.md and results/compare: the committed table is its records rendered by scripts/compare_report.py,
and every figure the page reads out of it (and the list of what is not yet run) is recomputed here."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from kvbench.results import read_records

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "results" / "compare"
PAGE = (ROOT / "docs" / "compare.md").read_text()
TEXT = " ".join(PAGE.split())


@pytest.fixture(scope="module")
def data():
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("compare_report", ROOT / "scripts" / "compare_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    records = read_records(FOLDER)
    return module, records, module.rows(records)


def test_table_is_its_records(data):
    module, records, by = data
    assert module.render(records) == (FOLDER / "table.md").read_text()
    assert '--8<-- "results/compare/table.md"' in PAGE
    assert (FOLDER / "accuracy_vs_kv.png").is_file()
    assert all(r["n_samples"] == 4 and r["batch_size"] == 4 for r in by.values())
    assert {r["git_sha"] for r in by.values()} <= set(re.findall(r"[0-9a-f]{40}", (FOLDER / "README.md").read_text()))


def test_what_is_not_yet_run(data):
    module, records, _ = data
    assert module.render_missing(records) == (FOLDER / "missing.md").read_text()
    assert '--8<-- "results/compare/missing.md"' in PAGE
