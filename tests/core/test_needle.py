"""kvbench-needle: one command sweeps needle depth x context length for chosen policies, records every run in
runs.jsonl and draws a heatmap per policy and a grid; kvbench-report renders them from the records."""

from __future__ import annotations

import sys

import pytest

from kvbench import needle
from kvbench.report import heatmap, write_report
from kvbench.results import read_records


def test_needle_sweep_records_and_heatmaps(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["kvbench-needle"])
    needle.main(["--lengths", "560,700", "--depths", "0,1", "--policy", "full",
                 "--policy", "window policy.kv_size=128 policy.evict_every=16",
                 "model=tiny-llama", "task.n_samples=2", "task.tokens_to_generate=4", "gen.max_new_tokens=4",
                 "batch_size=2", f"results_dir={tmp_path}"])
    recs = read_records(tmp_path)
    assert len(recs) == 8 and all(r["status"] == "ok" for r in recs)
    assert {(r["config"]["task"]["context_length"], r["config"]["task"]["depth"]) for r in recs} == {
        (560, 0.0), (560, 1.0), (700, 0.0), (700, 1.0)}
    grids = heatmap.cells(recs)
    assert len(grids) == 2  # one per policy
    for (_model, task, label), grid in grids.items():
        assert task == "niah_single_1" and set(grid) == {(0.0, 560), (1.0, 560), (0.0, 700), (1.0, 700)}
        for r in recs:
            t = r["config"]["task"]
            if heatmap.label(r, {"window": "prefill_and_decode"}) == label:
                assert grid[(t["depth"], t["context_length"])] == r["metrics"]["string_match_all"]
    plots = sorted(p.name for p in (tmp_path / "plots").glob("needle_*.png"))
    assert "needle_grid.png" in plots and len(plots) == 3
    assert "## Needle heatmaps" in (tmp_path / "tables.md").read_text()
    # the report alone renders them again from runs.jsonl
    for p in (tmp_path / "plots").glob("needle_*.png"):
        p.unlink()
    written = write_report(tmp_path)
    assert (tmp_path / "plots" / "needle_grid.png").is_file() and "needle_grid" in written
    # a second run of the same command resumes: nothing is run again
    needle.main(["--lengths", "560", "--depths", "0", "model=tiny-llama", "task.n_samples=2",
                 "task.tokens_to_generate=4", "gen.max_new_tokens=4", "batch_size=2", f"results_dir={tmp_path}"])
    assert len(read_records(tmp_path)) == 8


def test_needle_bad_input_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        needle.main(["--depths", "0,2", f"results_dir={tmp_path}"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == "kvbench-needle: error: --lengths and --depths must be non-empty, depths in [0, 1]"
    with pytest.raises(SystemExit) as exc:
        needle.main(["--lengths", "450", "--depths", "0", "model=tiny-llama", "policy.kv_size=-1",
                     f"results_dir={tmp_path}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvbench-needle: error: policy.kv_size") and "\n" not in err
