"""kvbench-report: a fixture runs.jsonl becomes the paper-layout tables (exact text), a CSV and plots.

The fixture mimics the paper's Llama-2 CNN/DM row: ED's first OOM at b=5 (from its search), FKV's
record at b=4 superseded by a newer one of the same configuration, an oom record, Batch-Max runs
at, near and below FKV's level, a non-default schedule, an error, and a second task.
"""

import csv
import dataclasses
from typing import ClassVar

import pytest

from kvbench import report
from kvbench.results import append_record, read_records
from kvbench.tasks import Task

GiB = 2**30


def _rec(run_id, policy, b, kv, metric=None, tok=None, status="ok", task="cnndm", schedule=None, **extra):
    name = "accuracy" if task == "gsm8k" else "rouge2"
    return {
        "run_id": run_id, "config_hash": extra.pop("config_hash", run_id), "status": status, "error": None,
        "experiment": "paper_llama2_cnndm", "model": "llama2-13b-chat", "task": task, "policy": policy,
        "kv_size": kv, "evict_every": 64, "schedule": schedule, "batch_size": b, "n_samples": 960,
        "max_new_tokens": 512, "metrics": {} if metric is None else {name: metric, "rouge1": 0.3},
        "throughput_tok_s": tok, "peak_mem_bytes": None, "search": None,
        "config": {"memory": {"limit_gb": 31.75}}, **extra,
    }


ED_SEARCH = {"max_batch_size": 4, "first_oom_batch_size": 5, "trials": [
    {"batch_size": 4, "status": "ok", "peak_mem_bytes": 30 * GiB},
    {"batch_size": 5, "status": "oom", "peak_mem_bytes": 33 * GiB},
]}
RECORDS = [
    _rec("ed4", "extreme_decode", 4, 2, 0.001, 42.0, schedule="decode_only", search=ED_SEARCH),
    _rec("fkv4-old", "full", 4, None, 0.150, 29.0, config_hash="fkv4"),
    _rec("fkv4", "full", 4, None, 0.145, 30.3, peak_mem_bytes=31 * GiB),
    _rec("fkv5", "full", 5, None, status="oom"),
    _rec("bm32", "batch_max", 32, 1024, 0.146, 73.8, schedule="prefill_and_decode"),
    _rec("bm40", "batch_max", 40, 896, 0.142, 80.3, schedule="prefill_and_decode"),
    _rec("bm48", "batch_max", 48, 640, 0.120, 90.0, schedule="prefill_and_decode"),
    _rec("bm48-1024", "batch_max", 48, 1024, status="oom", schedule="prefill_and_decode"),
    _rec("h2o", "h2o", 8, 1024, 0.140, 35.0, schedule="prefill_and_decode"),
    _rec("err", "window", 8, 512, status="error", error="RuntimeError: boom"),
    _rec("g-fkv", "full", 3, None, 0.34, 22.9, task="gsm8k"),
    _rec("g-ed", "extreme_decode", 3, 2, 0.0, 30.3, task="gsm8k", schedule="decode_only"),
]

CNNDM = "llama2-13b-chat_cnndm_n960_new512"
GSM8K = "llama2-13b-chat_gsm8k_n960_new512"
EXPECTED = f"""# kvbench results

12 records in runs.jsonl (1 ended with an error: not in the tables, see runs.csv). ED: extreme decoding-only eviction, FKV: full cache, BM: Batch-Max; tokens/s: generated tokens per second, prefill included.

## llama2-13b-chat · cnndm · 960 samples · 512 new tokens · auto attention

| Method | b | kv | ROUGE-2 | tokens/s |
|---|---:|---:|---:|---:|
| ED | 4 | 2 | 0.001 | 42.0 |
| ED | (b=5 OOM) | 2 | - | - |
| FKV | 4 | - | 0.145 | 30.3 |
| FKV | (b=5 OOM) | - | - | - |
| BM ≥ FKV | 32 | 1024 | 0.146 | 73.8 |
| BM ≥ FKV | (b=48 OOM) | 1024 | - | - |
| BM ≥ 96% FKV | 40 | 896 | 0.142 | 80.3 |
| H2O (P&D) ≥ 96% FKV | 8 | 1024 | 0.140 | 35.0 |

FKV level: 0.145; 96% of it: 0.139.

All runs:

| Method | b | kv | ROUGE-2 | tokens/s |
|---|---:|---:|---:|---:|
| ED | 4 | 2 | 0.001 | 42.0 |
| ED | (b=5 OOM) | 2 | - | - |
| FKV | 4 | - | 0.145 | 30.3 |
| FKV | (b=5 OOM) | - | - | - |
| BM | 48 | 640 | 0.120 | 90.0 |
| BM | 40 | 896 | 0.142 | 80.3 |
| BM | 32 | 1024 | 0.146 | 73.8 |
| BM | (b=48 OOM) | 1024 | - | - |
| H2O (P&D) | 8 | 1024 | 0.140 | 35.0 |

![metric vs throughput](plots/{CNNDM}_accuracy_vs_throughput.png)
![largest batch size per method](plots/{CNNDM}_max_batch_size.png)
![peak memory vs batch size](plots/{CNNDM}_peak_memory.png)

## llama2-13b-chat · gsm8k · 960 samples · 512 new tokens · auto attention

| Method | b | kv | accuracy | tokens/s |
|---|---:|---:|---:|---:|
| ED | 3 | 2 | 0.000 | 30.3 |
| FKV | 3 | - | 0.340 | 22.9 |

FKV level: 0.340; 96% of it: 0.326.

All runs:

| Method | b | kv | accuracy | tokens/s |
|---|---:|---:|---:|---:|
| ED | 3 | 2 | 0.000 | 30.3 |
| FKV | 3 | - | 0.340 | 22.9 |

![metric vs throughput](plots/{GSM8K}_accuracy_vs_throughput.png)
"""


@pytest.fixture
def results(tmp_path):
    for r in RECORDS:
        append_record(tmp_path, r)
    return tmp_path


def test_tables_csv_and_plots(results, capsys):
    report.main([str(results)])
    assert (results / "tables.md").read_text() == EXPECTED
    with open(results / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["run_id"] for r in rows] == [r["run_id"] for r in RECORDS]  # every record, errors included
    assert rows[0]["metric_rouge2"] == "0.001" and rows[0]["search_first_oom_batch_size"] == "5"
    assert rows[9]["status"] == "error" and rows[9]["error"] == "RuntimeError: boom"
    plots = sorted(p.name for p in (results / "plots").iterdir())
    assert plots == sorted([f"{CNNDM}_accuracy_vs_throughput.png", f"{CNNDM}_max_batch_size.png",
                            f"{CNNDM}_peak_memory.png", f"{GSM8K}_accuracy_vs_throughput.png"])
    for p in plots:
        assert (results / "plots" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "tables.md" in capsys.readouterr().out


def test_near_fkv_threshold_and_out_dir(results, tmp_path):
    out = tmp_path / "elsewhere"
    report.main([str(results), "--out", str(out), "--near-fkv", "0.99", "--no-plots"])
    text = (out / "tables.md").read_text()
    assert "| BM ≥ 99% FKV |" not in text  # 0.142 < 0.99 * 0.145: only the >= FKV pick is left
    assert "| H2O (P&D) ≥ 99% FKV |" not in text and "| BM ≥ FKV (also ≥ 99% FKV) | 32 | 1024 |" in text
    assert not (out / "plots").exists() and not (results / "tables.md").exists()


def test_no_runs_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        report.main([str(tmp_path)])
    assert exc.value.code == 2 and "no runs.jsonl" in capsys.readouterr().err


def test_fkv_at_zero_is_flagged(tmp_path):
    """A model that scores 0 with the full cache makes every eviction run 'reach' it: say so."""
    for r in [_rec("f", "full", 3, None, 0.0, 20.0, task="gsm8k"),
              _rec("b", "batch_max", 8, 128, 0.0, 40.0, task="gsm8k")]:
        append_record(tmp_path, r)
    report.main([str(tmp_path), "--no-plots"])
    text = (tmp_path / "tables.md").read_text()
    assert "| BM ≥ FKV (also ≥ 96% FKV) | 8 | 128 | 0.000 | 40.0 |" in text
    assert "FKV scores 0, so every run meets its level" in text


# ------------------------------------------------------------------------ issue 13: truthful tables
def _setting(n_shot, **more):
    return {"task": {"n_shot": n_shot, "seed": 0, "prompt_style": "chat"}, "memory": {"limit_gb": 31.75},
            "device": "cuda", **more}


def test_settings_are_kept_apart(tmp_path):
    """Case 4: runs of another n_shot are another table, named by what differs; FKV comes from its own."""
    for r in [
        _rec("f0", "full", 4, None, 0.100, 30.0, config=_setting(0, batch_size=4)),
        _rec("b0", "batch_max", 32, 512, 0.099, 70.0, schedule="prefill_and_decode",
             config=_setting(0, batch_size=32, policy={"kv_size": 512})),
        _rec("f1", "full", 4, None, 0.150, 29.0, config=_setting(1, batch_size=4, search={"max_batch": False})),
        _rec("b1", "batch_max", 32, 512, 0.120, 72.0, schedule="prefill_and_decode",
             config=_setting(1, batch_size=32, policy={"kv_size": 512}, results_dir="elsewhere")),
    ]:
        append_record(tmp_path, r)
    report.main([str(tmp_path), "--no-plots"])
    text = (tmp_path / "tables.md").read_text()
    sections = text.split("\n## ")[1:]
    assert [s.splitlines()[0] for s in sections] == [
        "llama2-13b-chat · cnndm · 960 samples · 512 new tokens · auto attention · task.n_shot=0",
        "llama2-13b-chat · cnndm · 960 samples · 512 new tokens · auto attention · task.n_shot=1",
    ]
    zero, one = sections
    assert zero.count("| FKV | 4 |") == 2 and "| FKV | 4 | - | 0.100 | 30.0 |" in zero  # summary + all runs
    assert "| BM ≥ 96% FKV | 32 | 512 | 0.099 | 70.0 |" in zero
    assert "0.150" not in zero and "0.100" not in one
    assert "| BM ≥" not in one  # 0.120 < 0.96 x its own FKV (0.150): no pick, whatever the other table's FKV


def test_a_search_where_nothing_fits_is_an_oom_row(tmp_path):
    """Case 5: ED at a tight budget fits no batch (record batch_size null, as kvbench wrote it): "(b=1 OOM)"."""
    nothing = {"max_batch_size": None, "first_oom_batch_size": 1, "trials": [
        {"batch_size": 1, "status": "oom", "peak_mem_bytes": 40 * GiB}]}
    for r in [_rec("ed", "extreme_decode", None, 2, status="oom", schedule="decode_only", search=nothing,
                   peak_mem_bytes=40 * GiB),
              _rec("bm", "batch_max", None, 256, status="oom", schedule="prefill_and_decode", search=nothing),
              _rec("f", "full", 1, None, status="oom")]:
        append_record(tmp_path, r)
    report.main([str(tmp_path)])
    text = (tmp_path / "tables.md").read_text()
    assert "| ED | (b=1 OOM) | 2 | - | - |" in text and "| FKV | (b=1 OOM) | - | - | - |" in text
    assert "| BM | (b=1 OOM) | 256 | - | - |" in text


def test_records_it_cannot_use_never_crash_the_report(tmp_path):
    """Case 2: a non-UTF-8 line, a stub and records without a policy or with odd fields: left out, counted."""
    append_record(tmp_path, _rec("ok", "full", 4, None, 0.1, 30.0))
    with open(tmp_path / "runs.jsonl", "ab") as f:
        f.write(b'{"status": "ok"}\n\xff\xfe\n')
    append_record(tmp_path, {"run_id": "np", "config_hash": "np", "status": "ok"})
    append_record(tmp_path, _rec("odd", "window", 4, 8, 0.1, 30.0, metrics=[1]))
    append_record(tmp_path, _rec("int", "h2o", 4, 8, status="interrupted", error="interrupted: SIGTERM"))
    report.main([str(tmp_path)])
    text = (tmp_path / "tables.md").read_text()
    assert text.splitlines()[2].startswith("4 records in runs.jsonl (1 interrupted: not in the tables)"
                                           " (2 the report cannot use: metrics is not a mapping, no policy).")
    assert "| FKV | 4 | - | 0.100 | 30.0 |" in text and "Window" not in text and "H2O" not in text
    with open(tmp_path / "runs.csv") as f:
        assert [r["run_id"] for r in csv.DictReader(f)] == ["ok", "np", "odd", "int"]


def test_a_serve_run_has_its_own_table_and_no_batch_size(tmp_path):
    """mode=serve records: their own table ("serving mode" in its title), the b column says "serve", never
    a static "b=1" row next to static runs."""
    from hydra import compose, initialize_config_dir

    from kvbench import report
    from kvbench import run as kvrun
    from kvbench.config import CONF_DIR

    base = ["model=tiny-llama", "task.n_samples=2", "task.context_tokens=32", "gen.max_new_tokens=2",
            "policy=batch_max", "policy.kv_size=32", "policy.evict_every=8", "serve.plot=false",
            f"results_dir={tmp_path}"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for extra in (["batch_size=1"], ["mode=serve"]):
            assert kvrun.run(compose("config", overrides=[*base, *extra]))["status"] == "ok"
    tables = report.tables(read_records(tmp_path), 0.96)
    assert len(tables) == 2
    serve = next(t for t in tables if "serving mode" in t.title)
    static = next(t for t in tables if t is not serve)
    assert [r.cells()[1] for r in serve.runs] == ["serve"] and [r.cells()[1] for r in static.runs] == ["1"]


# ------------------------------------------------------------------------ the task's own metric
@dataclasses.dataclass
class _F1Task(Task):
    """A task whose metric is neither a paper column nor the alphabetically first key of its records."""

    name: ClassVar[str] = "toy_qa"
    metric: ClassVar[str] = "f1"


@pytest.mark.parametrize("known_by", ["registry", "config_target"])
def test_the_metric_column_is_the_tasks_own(tmp_path, monkeypatch, known_by):
    """The table shows `Task.metric` (f1), not the first key (exact_match), whether the task is registered or
    named only by the record's config (`task._target_`)."""
    from kvbench import tasks

    if known_by == "registry":
        monkeypatch.setitem(tasks.TASKS, "toy_qa", _F1Task)
    target = {"task": {"_target_": f"{__name__}._F1Task"}} if known_by == "config_target" else {}
    for i, (policy, kv) in enumerate((("full", None), ("batch_max", 64))):
        rec = _rec(f"r{i}", policy, 4, kv, None, 10.0 + i, task="toy_qa")
        rec["metrics"] = {"exact_match": 0.9, "f1": 0.25 + i / 10, "accuracy_ish": 0.5}
        rec["config"] = {**rec["config"], **target}
        append_record(tmp_path, rec)
    report.main([str(tmp_path), "--no-plots"])
    text = (tmp_path / "tables.md").read_text()
    assert "| Method | b | kv | f1 | tokens/s |" in text
    assert "| FKV | 4 | - | 0.250 | 10.0 |" in text and "0.900" not in text
