"""The command line: bad overrides fail in one line with exit code 2 before any model loads;
a good one writes exactly one record and a predictions file."""

import json
import subprocess
import sys

import pytest

from kvbench import cli
from kvbench import run as kvrun
from kvbench.results import read_jsonl, read_records
from tests.conftest import assert_one_line_exit_2

BAD = {
    "policy=nope": "policy=nope",
    "model=nope": "model=nope",
    "task=nope": "task=nope",
    "nokey=1": "nokey",
    "policy=window policy.nokey=3": "policy.nokey",
    "batch_size=abc": "batch_size",
    "batch_size=0": "batch_size",
    "policy=window policy.kv_size=0": "policy.kv_size",
    "policy=batch_max policy.kv_size=-4": "policy.kv_size",
    "policy=window policy.evict_every=0": "policy.evict_every",
    "policy=batch_max policy.kv_size=64 policy.evict_every=64": "policy.evict_every",
    "policy=batch_max policy.schedule=sometimes": "policy.schedule",
    "gen.max_new_tokens=0": "gen.max_new_tokens",
    "data.dir=/does/not/exist": "data.dir",
    "task.n_samples=0": "task.n_samples",
    "memory.limit_gb=-1": "memory.limit_gb",
    "memory.limit_gb=lots": "memory.limit_gb",
    "search.candidates=[]": "search.candidates",
    "search.candidates=[0,4]": "search.candidates",
    "search.max_batch=true batch_size=4": "batch_size",
    "gen.attention=xformers": "gen.attention",
    "-m policy=window,batch_max policy.kv_size=64 policy.evict_every=100": "policy.evict_every",
}


@pytest.fixture(autouse=True)
def no_model_loading(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(kvrun.models, "load_model", refuse)


@pytest.mark.parametrize("args", list(BAD), ids=list(BAD))
def test_bad_override_is_one_line_exit_2(args, capsys, tmp_path):
    assert_one_line_exit_2(cli.main, args.split() + [f"results_dir={tmp_path}"], capsys, BAD[args])
    assert not (tmp_path / "runs.jsonl").exists()


def test_cuda_without_gpu(capsys, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(SystemExit) as exc:
        cli.main(["device=cuda", f"results_dir={tmp_path}"])
    assert exc.value.code == 2 and "device" in capsys.readouterr().err


def test_flash_needs_cuda_and_the_extra(capsys, tmp_path):
    from kvbench.attention import flash_available

    if flash_available():
        pytest.skip("flash-attn is usable here")
    with pytest.raises(SystemExit) as exc:
        cli.main(["gen.attention=flash", f"results_dir={tmp_path}"])
    assert exc.value.code == 2 and "gen.attention" in capsys.readouterr().err


def test_subprocess_has_no_traceback(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "kvbench", "policy=window", "policy.kv_size=0", f"results_dir={tmp_path}"],
        capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and p.stderr.strip().count("\n") == 0
    assert p.stderr.startswith("kvbench: error: policy.kv_size=0")


def test_run_writes_one_record_and_predictions(tmp_path, monkeypatch):
    monkeypatch.undo()  # allow model loading here
    args = ["model=tiny-llama", "task.n_samples=4", "task.context_tokens=64", "batch_size=2",
            "gen.max_new_tokens=4", "policy=batch_max", "policy.kv_size=64", "policy.evict_every=16",
            f"results_dir={tmp_path}", "output.save_prompt_ids=true"]
    monkeypatch.setattr(sys, "argv", ["kvbench"])
    cli.main(args)
    (rec,) = read_records(tmp_path)
    assert rec["status"] == "ok" and rec["policy"] == "batch_max" and rec["kv_size"] == 64
    for key in ("run_id", "started_at", "kvbench_version", "git_sha", "error", "model", "task", "evict_every",
                "schedule", "batch_size", "n_samples", "max_new_tokens", "seed", "device", "metrics",
                "throughput_tok_s", "prefill_s", "decode_s", "wall_s", "peak_kv_bytes", "peak_mem_bytes",
                "search", "config", "predictions_path"):
        assert key in rec
    rows = read_jsonl(rec["predictions_path"])
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    for r in rows:
        assert set(r) >= {"index", "prompt", "prompt_tokens", "prediction", "references", "token_ids", "score", "prompt_ids"}
        assert len(r["token_ids"]) <= 4 and r["prompt_tokens"] == len(r["prompt_ids"])
    assert rec["metrics"]["accuracy"] == sum(r["score"]["accuracy"] for r in rows) / 4
    json.dumps(rec)


def test_multirun_of_the_baselines_with_kv_ratio_and_pyramidkv(tmp_path, monkeypatch):
    """`kvbench -m policy=snapkv,pyramidkv,...` on tiny Llama at batch 4 (passkey prompts of different lengths,
    left-padded), both schedules; records carry the budgets used."""
    monkeypatch.undo()
    pols = "snapkv,pyramidkv,streaming_llm,knorm,keydiff,random,tova"
    common = ["-m", "model=tiny-llama", "task.n_samples=4", "task.context_tokens=96", "batch_size=4",
              "gen.max_new_tokens=4", "policy.kv_size=48", "policy.evict_every=8",
              "policy.schedule=prefill_and_decode,decode_only", f"results_dir={tmp_path}", "hydra/job_logging=none",
              "hydra/hydra_logging=none"]
    # the observation window's published 64 does not fit kv 48; beta 2 makes PyramidKV's layers differ here
    for args in ([*common, "policy=snapkv", "policy.window=16"], [*common, "policy=pyramidkv", "policy.window=16",
                                                                   "policy.beta=2"],
                 [*common, "policy=streaming_llm,knorm,keydiff,random,tova"]):
        monkeypatch.setattr(sys, "argv", ["kvbench", *args])
        cli.main(args)
    recs = read_records(tmp_path)
    assert sorted((r["policy"], r["schedule"]) for r in recs) == sorted(
        (p, s) for p in pols.split(",") for s in ("prefill_and_decode", "decode_only"))
    assert all(r["status"] == "ok" for r in recs)
    pyr = [r for r in recs if r["policy"] == "pyramidkv"]
    assert all(r["kv_budget"]["per_layer"] and r["kv_budget"]["min"] < 48 < r["kv_budget"]["max"] for r in pyr)
    # kv_ratio: the budget is a share of each prompt
    args = ["model=tiny-llama", "task.n_samples=4", "task.context_tokens=96", "batch_size=4", "gen.max_new_tokens=4",
            "policy=batch_max", "policy.kv_ratio=0.5", "policy.evict_every=8", f"results_dir={tmp_path}/r"]
    monkeypatch.setattr(sys, "argv", ["kvbench", *args])
    cli.main(args)
    (rec,) = read_records(tmp_path / "r")
    assert rec["kv_ratio"] == 0.5 and rec["kv_size"] is None and rec["kv_budget"]["by"] == "kv_ratio"
    assert rec["kv_budget"]["min"] <= rec["kv_budget"]["max"] and not rec["kv_budget"]["per_layer"]
    assert any("kv_ratio" in e for e in rec["extensions"])
