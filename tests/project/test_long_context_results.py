"""The committed long-context results (docs/long-context.md) are what their records say: the RULER table is
recomputed from results/ruler_cpu/runs.jsonl and its scores files, and the needle heatmap's cells from
results/needle_cpu/runs.jsonl."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from kvbench.report import heatmap
from kvbench.results import read_records

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("ruler_table", ROOT / "scripts" / "ruler_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ruler_table_is_recomputed_from_the_records():
    out = ROOT / "results" / "ruler_cpu"
    text, n = _script().table(out)
    assert n >= 2 and text == (out / "table.md").read_text()
    assert '--8<-- "results/ruler_cpu/table.md"' in (ROOT / "docs" / "long-context.md").read_text()


def test_needle_heatmap_cells_are_the_records():
    recs = read_records(ROOT / "results" / "needle_cpu")
    grids = heatmap.cells(recs)
    assert grids and all(len(g) >= 2 for g in grids.values())
    ok = [r for r in recs if r["status"] == "ok"]
    for r in ok:
        t = r["config"]["task"]
        assert any(g.get((t["depth"], t["context_length"])) == r["metrics"]["string_match_all"]
                   for g in grids.values())
    assert "](../results/needle_cpu/plots/needle_grid.png)" in (ROOT / "docs" / "long-context.md").read_text()
