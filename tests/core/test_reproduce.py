"""The protocol driver on a tiny setting: ED's search, FKV at ED's batch, Batch-Max's kv grid, the
picks; a second invocation resumes (skips everything already recorded)."""

import json

from kvbench import reproduce
from kvbench.results import read_records

TINY = [
    "experiment=mini_cnndm", "model=tiny-llama", "task=passkey", "task.context_tokens=256", "task.n_samples=8",
    "search.candidates=[1,2,4,8]", "gen.max_new_tokens=8", "memory.limit_gb=0.007",
    "reproduce.kv_sizes=[96,160]", "policy.evict_every=32",
]


def test_driver_follows_the_protocol_and_resumes(tmp_path, capsys):
    args = [*TINY, f"results_dir={tmp_path}"]
    reproduce.main(args)
    out = capsys.readouterr().out
    result = json.loads(next(line for line in out.splitlines() if line.startswith('{"reproduce"')))["reproduce"]
    recs = read_records(tmp_path)
    by = {(r["policy"], r["kv_size"]): r for r in recs}
    ed = by[("extreme_decode", 2)]
    assert ed["search"]["max_batch_size"] == 2 and ed["search"]["first_oom_batch_size"] == 4
    assert ed["batch_size"] == 2 and ed["status"] == "ok"
    assert by[("full", None)]["batch_size"] == 2  # FKV runs at ED's batch size
    bms = [r for r in recs if r["policy"] == "batch_max"]
    coarse = [r for r in bms if r["kv_size"] in (96, 160)]
    assert len(coarse) == 2  # the grid
    centre = max(coarse, key=lambda r: r["throughput_tok_s"])["kv_size"]  # all meet FKV's accuracy of 0
    refined = {kv for kv in (centre - 64, centre + 64) if kv > 32} - {96, 160}
    assert {r["kv_size"] for r in bms} == {96, 160} | refined  # + the kv sizes around the best coarse one
    assert all(r["batch_size"] == 8 for r in bms)  # Batch-Max fits the largest candidate
    fastest = max(bms, key=lambda r: r["throughput_tok_s"])  # every BM meets FKV's accuracy of 0 here
    assert result["bm_at_fkv"]["kv_size"] == fastest["kv_size"]
    assert (tmp_path / "tables.md").read_text().count("BM ≥ FKV") == 1
    reproduce.main(args)  # resumes: nothing new to run
    assert len(read_records(tmp_path)) == len(recs)


def test_driver_bad_override_is_one_line(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as e:
        reproduce.main(["experiment=mini_cnndm", "policy.kv_size=0", f"results_dir={tmp_path}"])
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def _curve(threshold: int, calls: list[int]):
    """A fake Batch-Max run: metric 1 from kv >= threshold on, else 0.5; faster at smaller kv."""

    def bm(kv: int):
        calls.append(kv)
        return reproduce.Point("batch_max", kv, 8, 1.0 if kv >= threshold else 0.5, 1000.0 / kv)

    return bm


def test_kv_search_extends_a_too_short_grid_to_the_smallest_kv_at_the_level():
    calls: list[int] = []
    tried = reproduce.search_kv_sizes(_curve(700, calls), [128, 256, 512], fkv=1.0, near=0.96, step=128,
                                      refine_step=64, cap=2736, min_kv=64)
    assert len(calls) == len(set(calls))  # every kv size runs once
    # grid misses; doubling 512 -> 1024 hits; bisection 768 (hit) -> 640 (miss); refine 704 (hit), 832
    assert calls == [128, 256, 512, 1024, 768, 640, 704, 832]
    best = reproduce.pick([p for p in tried.values() if p], 1.0)
    assert best.kv_size == 704


def test_kv_search_stops_at_the_cap_and_keeps_a_hitting_grid():
    calls: list[int] = []
    reproduce.search_kv_sizes(_curve(10_000, calls), [128, 256], fkv=1.0, near=0.96, step=128,
                              refine_step=64, cap=600, min_kv=64)
    assert calls == [128, 256, 512, 640, 576, 704]  # 640 = the cap rounded up to 128; refine around the largest
    calls.clear()
    reproduce.search_kv_sizes(_curve(200, calls), [128, 256, 512], fkv=1.0, near=0.96, step=128,
                              refine_step=64, cap=2736, min_kv=64)
    assert calls == [128, 256, 512, 192, 320]  # the grid reaches the level: no extension
