"""docs/compare.md and results/compare: the committed table is its records rendered by scripts/compare_report.py,
and every figure the page reads out of it (and the list of what is not yet run) is recomputed here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvbench.results import read_records
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "results" / "compare"
PAGE = (ROOT / "docs" / "compare.md").read_text()
TEXT = " ".join(PAGE.split())


@pytest.fixture(scope="module")
def data():
    module = load_script("compare_report")
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


# the figures "How to read it" quotes: (task, policy, ratio) -> (accuracy, its interval or None)
READ = {("niah1k", "full", None): (1.0, None), ("niah1k", "compactor", 0.5): (1.0, None),
        ("niah1k", "chunkkv", 0.5): (0.75, "[0.250, 1.000]"), ("niah1k", "batch_max", 0.5): (0.0, None),
        ("niah1k", "critical", 0.5): (0.0, None), ("cnndm", "full", None): (0.082, "[0.019, 0.146]")}


HELD_FULL = ("kvzip", "kvzip_plus", "kvgrad", "duo_attention")  # hold the full cache's bytes while decoding


def test_what_the_page_reads(data):
    module, _, by = data
    for (task, policy, ratio), (value, interval) in READ.items():
        m, (lo, hi) = module.metric(by[(task, True, policy, ratio)])
        assert round(m, 3) == value
        assert interval is None or (interval == f"[{lo:.3f}, {hi:.3f}]" and interval in TEXT)
    peak = {p: by[("niah1k", True, p, r)]["peak_kv_bytes"] / module.MIB for p, r in [("full", None), ("compactor", 0.5)]}
    assert f"{peak['compactor']:.1f} MiB at ratio 0.5 on niah1k against the full cache's {peak['full']:.1f} MiB" in TEXT
    shares = [module.share(by, k, "decode_kv_bytes_mean") for k in by
              if k[0] == "niah1k" and k[3] == 0.5 and k[2] not in HELD_FULL]
    assert f"{min(shares):.2f} to {max(shares):.2f} of the full cache's at ratio 0.5" in TEXT
    held = {round(module.share(by, ("niah1k", True, p, 0.5), "decode_kv_bytes_mean"), 2) for p in HELD_FULL}
    assert held == {1.0} and "`kvzip`, `kvzip_plus`, `kvgrad` and `duo_attention`, which held 1.00 of it" in TEXT
    times = [f"{by[('niah1k', True, p, r)]['prefill_s']:.1f} s" for p, r in [("critical", 0.5), ("full", None)]]
    assert f"`critical`'s {times[0]} against the full cache's {times[1]}" in TEXT

