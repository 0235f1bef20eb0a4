"""`make demo`: the paper's point at one memory limit (the default), and every policy kvbench has (`--all`).

The default demo's rows are the full cache, ED, Batch-Max at two budgets and three baselines under Batch-Max's
schedule and budget, each at the largest batch the search finds under the experiment's accounted limit. The
all-policies form is counted from the other side, the shipped configs (conf/policy/*.yaml), so a policy without
a config or a class fails here, and a new policy joins it without an edit."""

import pytest

from kvbench import demo
from kvbench.conf import options
from kvbench.policies import registry
from kvbench.results import read_records

TINY = ["model=tiny-llama", "task.context_tokens=16", "gen.max_new_tokens=2"]


def final_table(out: str) -> list[str]:
    """The rows of the table printed last (a header, a rule, a row per run)."""
    table = out[out.rindex("task "):]
    return [line for line in table.splitlines()[2:] if line.startswith(("passkey", "cnndm"))]


def test_default_demo_runs_its_rows_each_at_the_largest_batch_that_fits(tmp_path, capsys):
    demo.main([*TINY, f"results_dir={tmp_path}", "task.n_samples=4", "search.candidates=[1,2,4]",
               "memory.limit_gb=0.34"])
    records = read_records(tmp_path)
    assert all(r["status"] == "ok" for r in records), [r["error"] for r in records]
    assert [(r["policy"], r["kv_size"]) for r in records] == [
        ("full", None), ("extreme_decode", 2), ("batch_max", 512), ("batch_max", 256),
        ("streaming_llm", 256), ("h2o", 256), ("tova", 256)]
    assert {r["experiment"] for r in records} == {"demo_passkey"} and {r["task"] for r in records} == {"passkey"}
    for r in records:  # every run searched its batch under the one limit, then ran there
        assert r["search"]["decided_by"] == "accounted" and r["batch_size"] == r["search"]["max_batch_size"]
        assert r["config"]["memory"]["limit_gb"] == 0.34 and r["generated_tokens"] == 2 * r["n_samples"]
    bm, *baselines = [r for r in records if r["kv_size"] == 256]  # one schedule, one budget: only the score differs
    assert {(r["schedule"], r["evict_every"]) for r in baselines} == {(bm["schedule"], bm["evict_every"])} == {
        ("prefill_and_decode", 64)}
    out = capsys.readouterr().out
    assert [line.split()[1] for line in final_table(out)] == [r["policy"] for r in records]
    assert "passkey: 4 prompts of" in out and "batch: the largest that fits 0.34 GiB (accounted)" in out


def test_all_runs_every_registered_policy(tmp_path, capsys):
    demo.main(["--all", *TINY, f"results_dir={tmp_path}"])
    records = read_records(tmp_path)
    assert sorted(r["policy"] for r in records) == options("policy") == sorted(registry())
    assert {r["task"] for r in records} == {"passkey"}  # no data.dir: the synthetic task only
    assert all(r["status"] == "ok" for r in records), [r["error"] for r in records]
    assert [line.split()[1] for line in final_table(capsys.readouterr().out)] == [r["policy"] for r in records]


def rec(policy: str, accuracy: float, task: str = "passkey") -> dict:
    return {"task": task, "policy": policy, "schedule": "prefill_and_decode", "kv_size": 256, "batch_size": 4,
            "status": "ok", "metrics": {"accuracy": accuracy}, "throughput_tok_s": 10.0, "peak_kv_bytes": 2**20}


def test_a_row_below_the_full_cache_says_why_on_the_line_under_it():
    lines = demo.table([rec("full", 1.0), rec("batch_max", 0.5), rec("tova", 1.0), rec("kvzip", 0.0),
                        rec("full", 0.5, "cnndm"), rec("batch_max", 0.25, "cnndm")]).splitlines()[2:]
    why = [line.split("why: ", 1)[1] if "why: " in line else line.split()[1] for line in lines]
    assert why == ["full", "batch_max", demo.REASONS["batch_max"], "tova", "kvzip", demo.OTHER_REASON,  # no sentence
                   "full", "batch_max", demo.OTHER_REASON]  # for the reference, nor at its score; not retrieval: general
    assert "average attention evicts" in demo.REASONS["batch_max"]
    every = demo.table([rec("full", 1.0), *[rec(name, 0.0) for name in [*demo.REASONS, "kvzip"]]]).splitlines()
    assert max(map(len, every)) <= 95  # the table fits the docs' code column


def test_bad_input_stops_before_any_run(tmp_path, capsys):
    for argv in (["--al"], [*TINY, "task.context_tokens=3"]):
        with pytest.raises(SystemExit) as e:
            demo.main([*argv, f"results_dir={tmp_path}"])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("kvbench-demo: error: ") and "\n" not in err
    assert not (tmp_path / "runs.jsonl").exists()
