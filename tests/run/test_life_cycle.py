"""Nothing finished is ever lost, and what can be checked without the model is checked before it loads
(issue 21): the results folder, data rows' types, a pool that can hold a request, task limits, the
model's files offline; a results folder that fails only at the end sends everything to a rescue folder;
SIGINT ends as quietly as SIGTERM; a logger or policy description that fails still leaves a record."""

from __future__ import annotations

import errno
import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from kvbench import capacity, cli, results
from kvbench import run as kvrun
from kvbench.config import CONF_DIR
from kvbench.results import read_jsonl, read_records
from tests.conftest import assert_one_line_exit_2

TINY = ["model=tiny-llama", "task.n_samples=2", "task.context_tokens=32", "gen.max_new_tokens=2", "batch_size=2",
        "policy=batch_max", "policy.kv_size=32", "policy.evict_every=8"]


@pytest.fixture
def no_model_loading(monkeypatch):
    monkeypatch.setattr(kvrun.models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


# ------------------------------------------------------------------------- refused before the model
def test_results_folder_that_cannot_take_the_record(tmp_path, capsys, no_model_loading):
    (tmp_path / "file").write_text("not a folder")
    assert_one_line_exit_2(cli.main, [*TINY, f"results_dir={tmp_path / 'file' / 'sub'}"], capsys, "results_dir")
    (tmp_path / "r" / "runs.jsonl").mkdir(parents=True)  # runs.jsonl is a folder
    err = assert_one_line_exit_2(cli.main, [*TINY, f"results_dir={tmp_path / 'r'}"], capsys, "results_dir")
    assert "must be a file" in err


def test_unwritable_results_folder(tmp_path, capsys, no_model_loading, monkeypatch):
    """A read-only folder (as root, permissions do not stop writes: the probe is made to fail instead)."""
    def refuse(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(results.tempfile, "mkstemp", refuse)
    err = assert_one_line_exit_2(cli.main, [*TINY, f"results_dir={tmp_path}"], capsys, "results_dir")
    assert "cannot be written: Permission denied" in err


def test_a_row_of_the_wrong_type_is_named_before_the_model(tmp_path, capsys, no_model_loading):
    rows = [{"article": "A fine day.", "highlights": "Fine."}] * 3 + [{"article": 12345, "highlights": None}]
    (tmp_path / "cnn_dailymail").mkdir()
    for split in ("test", "validation"):
        with gzip.open(tmp_path / "cnn_dailymail" / f"{split}.jsonl.gz", "wt") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    err = assert_one_line_exit_2(cli.main, ["model=tiny-llama", "task=cnndm", f"data.dir={tmp_path}",
                                            "task.n_samples=2", f"results_dir={tmp_path / 'res'}"], capsys, "data.dir")
    assert "test.jsonl.gz:4: column 'article' must be text, not int (12345)" in err


@pytest.mark.parametrize("args,key,why", [
    (["mode=serve", "policy=full", "serve.num_blocks=1"], "serve.num_blocks", "can never hold request 0"),
    # a decode_only request holds its whole prompt (355 tokens) before it evicts to kv_size 32
    (["mode=serve", "policy=h2o", "policy.kv_size=32", "serve.num_blocks=4"], "serve.num_blocks", "needs 23 blocks"),  # 355 + 8 - 1 pairs
    (["task=cnndm", "task.max_input_tokens=64", "data.dir=MIRROR"], "task.max_input_tokens", "is too small"),
])
def test_what_needs_the_tokenizer_but_not_the_model(args, key, why, tmp_path, capsys, no_model_loading):
    mirror = tmp_path / "cnn_dailymail"
    mirror.mkdir()
    for split in ("test", "validation"):
        (mirror / f"{split}.jsonl").write_text(json.dumps({"article": "word " * 200, "highlights": "h."}) + "\n")
    args = [a.replace("MIRROR", str(tmp_path)) for a in args]
    passkey = [] if "task=cnndm" in args else ["task.context_tokens=40"]
    err = assert_one_line_exit_2(cli.main, ["model=tiny-llama", "task.n_samples=1", *passkey,
                                            "gen.max_new_tokens=8", *args, f"results_dir={tmp_path / 'r'}"],
                                 capsys, key)
    assert why in err, err
    assert not (tmp_path / "r").exists()  # refused before the results folder is even made


def test_hub_model_not_cached_offline_is_one_line_at_once(tmp_path, capsys, monkeypatch, no_model_loading):
    import time

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    t0 = time.perf_counter()
    err = assert_one_line_exit_2(cli.main, ["model=phi35-mini", "device=cpu", f"results_dir={tmp_path}"], capsys,
                                 "model.pretrained")
    assert time.perf_counter() - t0 < 30 and "not in the local Hugging Face cache" in err and "hf download" in err


def test_plan_with_an_unknown_model_is_one_line(tmp_path):
    # the real command in its own process: in process, Hydra's error path wrote to a stream an earlier test's
    # capture had closed, which killed the interpreter ("lost sys.stderr") when the paper's plans ran first
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-m", "kvbench.capacity", "model=llama2-13b-chat", "model.pretrained=nobody/nothing",
                          "plan.prompt_tokens=100", "memory.limit_gb=10", f"results_dir={tmp_path}"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    err = out.stderr.strip()
    assert out.returncode == 2 and "\n" not in err and err.startswith("kvbench-plan: error: model.pretrained"), err


@pytest.mark.parametrize("arg", ["plan.backends=[]", "plan.backends=[math]", "plan.gpus=0", "plan.kv_sizes=[4]"])
def test_kvbench_refuses_the_plan_values_kvbench_plan_refuses(arg, tmp_path, capsys, no_model_loading):
    key = arg.split("=")[0]
    assert_one_line_exit_2(cli.main, [*TINY, arg, f"results_dir={tmp_path}"], capsys, key)
    with pytest.raises(SystemExit) as exc:
        capacity.main([arg, "memory.limit_gb=10", f"results_dir={tmp_path}"])
    assert exc.value.code == 2 and key in capsys.readouterr().err


def test_snapkv_window_too_large_names_the_window(tmp_path, capsys, no_model_loading):
    err = assert_one_line_exit_2(cli.main, ["policy=snapkv", "policy.kv_size=32", "policy.evict_every=8",
                                            "policy.window=32", f"results_dir={tmp_path}"], capsys, "policy.window=32")
    assert "protect_recent" not in err.split(":")[2]  # not a key the user set


# ------------------------------------------------------------------------- lost nowhere
def test_a_results_folder_failing_at_the_end_sends_everything_to_a_rescue_folder(tmp_path, monkeypatch, capsys):
    append = results.append_record

    def disk_full(results_dir, record, release=None):
        if str(results_dir) == str(tmp_path / "res"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return append(results_dir, record, release)

    monkeypatch.setattr(results, "append_record", disk_full)
    monkeypatch.setattr(kvrun.store.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    monkeypatch.setattr(sys, "argv", ["kvbench"])
    with pytest.raises(SystemExit) as exc:
        cli.main([*TINY, f"results_dir={tmp_path / 'res'}", "hydra/job_logging=none", "hydra/hydra_logging=none"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 1 and err.startswith("kvbench: error: could not write") and "No space left" in err
    (rescue,) = (tmp_path / "tmp" / "kvbench-rescue").iterdir()
    (rec,) = read_records(rescue)
    assert rec["status"] == "ok" and any(str(rescue) in n for n in rec["notes"])
    assert len(read_jsonl(rec["predictions_path"])) == 2  # written where the record says: the results folder
    assert read_records(tmp_path / "res") == []


def test_predictions_that_cannot_be_written_go_to_the_rescue_folder(tmp_path, monkeypatch):
    write = results.write_jsonl

    def fail_in_results(path, rows):
        if str(tmp_path / "res") in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(path, rows)

    monkeypatch.setattr(results, "write_jsonl", fail_in_results)
    monkeypatch.setattr(kvrun.store.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    with pytest.raises(kvrun.RecordNotWritten) as exc:
        kvrun.run(_cfg(*TINY, f"results_dir={tmp_path / 'res'}"))
    (rec,) = read_records(tmp_path / "res")  # the record itself still made it to runs.jsonl
    assert rec["status"] == "ok" and rec["predictions_path"].startswith(str(exc.value.rescue))
    assert len(read_jsonl(rec["predictions_path"])) == 2 and len(read_jsonl(rec["scores_path"])) == 2


@pytest.mark.parametrize("where", ["logger.start", "describe"])
def test_a_failure_before_the_model_still_leaves_a_record(where, tmp_path, monkeypatch):
    from kvbench.loggers import NullLogger
    from kvbench.policies import BatchMax

    def boom(*a, **k):
        raise RuntimeError(f"{where} broke")

    monkeypatch.setattr(NullLogger if where == "logger.start" else BatchMax, where.split(".")[-1], boom)
    rec = kvrun.run(_cfg(*TINY, f"results_dir={tmp_path}"))
    assert rec["status"] == "error" and f"{where} broke" in rec["error"]
    (stored,) = read_records(tmp_path)
    assert stored["run_id"] == rec["run_id"] and stored["mode"] == "run"


INTERRUPTED = textwrap.dedent("""
    import os, signal, sys
    from kvbench import cli
    from kvbench import run as kvrun
    execute = kvrun.{fn}
    def execute_then_int(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return execute(*args, **kwargs)
    kvrun.{fn} = execute_then_int
    cli.main(sys.argv[1:])
""")


@pytest.mark.parametrize("mode,fn", [("run", "static.execute"), ("serve", "models.load_within")])
def test_sigint_is_as_quiet_as_sigterm(mode, fn, tmp_path):
    args = [*TINY, f"mode={mode}"] if mode == "run" else [a for a in TINY if not a.startswith("batch_size")] + [
        "mode=serve"]
    p = subprocess.run([sys.executable, "-c", INTERRUPTED.format(fn=fn), *args, f"results_dir={tmp_path}"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 130, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) <= 3, p.stderr
    (rec,) = read_records(tmp_path)
    assert (rec["status"], rec["error"], rec["mode"]) == ("interrupted", "interrupted: SIGINT", mode)


def test_sigint_outside_a_run_is_one_line():
    # Python's own SIGINT handler, as under a terminal: a job started in the background (nohup, `&`, some CI
    # runners) inherits SIGINT ignored, and then no KeyboardInterrupt is ever raised
    code = ("import os, signal, time\nfrom kvbench import cli\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "cli.quiet_interrupt(lambda: os.kill(os.getpid(), signal.SIGINT) or time.sleep(5), 'kvbench')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 130 and p.stderr.strip() == "kvbench: interrupted (SIGINT)"


# ------------------------------------------------------------------------- serve's record
def test_serve_peak_counts_requests_that_finish_in_the_step(tmp_path):
    """max_new_tokens=1 and a step budget that takes every prompt whole: each request prefills and finishes
    in one step, so blocks in use after the step are 0; the peak is what the step held."""
    rec = kvrun.run(_cfg("model=tiny-llama", "task.n_samples=3", "task.context_tokens=40", "gen.max_new_tokens=1",
                          "mode=serve", "serve.max_tokens_per_step=4096", "serve.plot=false", f"results_dir={tmp_path}"))
    assert rec["status"] == "ok" and rec["serve"]["steps"] == 1
    assert rec["peak_kv_bytes"] > 0 and rec["serve"]["pool_util_max"] > 0
    prompts = rec["prompts"]["tokens_min"], rec["prompts"]["tokens_max"]
    assert rec["serve"]["timeline"]["blocks_used"][0] >= 3 * -(-prompts[0] // 16)
    assert rec["batch_size"] is None and rec["evict_every"] is None and rec["attention"] == "paged_sdpa"


def test_the_family_check_runs_once_per_run(tmp_path, monkeypatch):
    """The model's kinds are read once (`LoadedModel.kinds`) and checked against the policy once: by the run, on
    its longest sequence; the engine trusts kinds it is given."""
    from kvbench.models import family

    calls = []
    real = family.check_policy
    monkeypatch.setattr(family, "check_policy", lambda *a, **k: calls.append(a[2:] + tuple(k)) or real(*a, **k))
    rec = kvrun.run(_cfg(*TINY, f"results_dir={tmp_path}"))
    assert rec["status"] == "ok", rec.get("error")
    assert len(calls) == 1, calls
