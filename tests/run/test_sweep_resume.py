"""Sweeps survive: a sweep killed mid-way and re-run finishes the rest with no duplicate records, a
failing run is recorded as an error and the sweep goes on, and skip_existing defaults to true for
sweeps only (an explicit value wins either way)."""

import subprocess
import sys
import textwrap

import pytest

from kvbench import cli
from kvbench import run as kvrun
from kvbench.results import read_records

TINY = ["model=tiny-llama", "task.n_samples=2", "task.context_tokens=32", "gen.max_new_tokens=2", "batch_size=2"]
SWEEP = ["-m", *TINY, "policy=full,window"]

# The sweep in a child process that dies by SIGKILL (no cleanup, no record) when its second run starts.
KILLED_ON_SECOND_RUN = textwrap.dedent("""
    import os, signal, sys
    from kvbench import cli
    from kvbench import run as kvrun
    calls, execute = [], kvrun.static.execute
    def execute_then_die(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return execute(*args, **kwargs)
    kvrun.static.execute = execute_then_die
    cli.main(sys.argv[1:])
""")


@pytest.fixture(autouse=True)
def argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["kvbench"])


def _ok(results):
    return [r for r in read_records(results) if r["status"] == "ok"]


def test_killed_sweep_resumes_without_duplicates(tmp_path):
    args = [*SWEEP, f"results_dir={tmp_path}", f"hydra.sweep.dir={tmp_path / 'hydra'}"]
    p = subprocess.run([sys.executable, "-c", KILLED_ON_SECOND_RUN, *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == -9, p.stderr[-2000:]
    (first,) = read_records(tmp_path)  # the killed run left nothing
    assert first["status"] == "ok" and first["policy"] == "full"

    cli.main(args)  # the same command again: full is skipped, window runs
    records = read_records(tmp_path)
    assert [r["policy"] for r in records] == ["full", "window"] and records[0] == first
    assert all(r["status"] == "ok" for r in records)
    assert len({r["config_hash"] for r in records}) == 2
    assert all(r["config"]["skip_existing"] is True for r in records)


def test_failing_run_is_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch):
    args = [*SWEEP, f"results_dir={tmp_path}", f"hydra.sweep.dir={tmp_path / 'hydra'}"]
    execute = kvrun.static.execute

    def fail_full(cfg, *a, **k):
        if cfg.policy.kv_size is None:
            raise RuntimeError("boom in the full-cache run")
        return execute(cfg, *a, **k)

    monkeypatch.setattr(kvrun.static, "execute", fail_full)
    cli.main(args)  # no SystemExit: a sweep goes on past a failed run
    err, ok = read_records(tmp_path)
    assert (err["policy"], err["status"], err["error"]) == ("full", "error", "RuntimeError: boom in the full-cache run")
    assert (ok["policy"], ok["status"]) == ("window", "ok")

    monkeypatch.setattr(kvrun.static, "execute", execute)
    cli.main(args)  # the re-run retries the error only
    assert [r["policy"] for r in read_records(tmp_path)] == ["full", "window", "full"]
    assert sorted(r["policy"] for r in _ok(tmp_path)) == ["full", "window"]


def test_skip_existing_defaults_and_overrides(tmp_path):
    one = [*TINY, f"results_dir={tmp_path}"]
    cli.main(one)
    cli.main(one)  # a single run is not skipped by default
    assert len(read_records(tmp_path)) == 2
    cli.main([*one, "skip_existing=true"])  # unless asked
    assert len(read_records(tmp_path)) == 2
    cli.main(["-m", *one, "skip_existing=false", f"hydra.sweep.dir={tmp_path / 'hydra'}"])  # a sweep may opt out
    assert len(read_records(tmp_path)) == 3


# ------------------------------------------------------------------ issue 13: records that tell the truth
def test_recorded_batch_size_is_the_one_that_ran(tmp_path, capsys):
    """Case 3: a fixed batch larger than the data runs and records the data's size; a search's
    candidates stop at the sample count, so neither records a batch size that never ran."""
    cli.main([*TINY, "batch_size=8", "task.n_samples=3", f"results_dir={tmp_path}"])
    (rec,) = read_records(tmp_path)
    assert rec["status"] == "ok" and rec["batch_size"] == 3 and rec["config"]["batch_size"] == 8
    assert any("larger than the 3 samples" in n for n in rec["notes"])
    assert "WARNING] - batch_size=8 is larger than the 3 samples" in capsys.readouterr().out  # Hydra's log
    cli.main([*TINY[:-1], "task.n_samples=3", "search.max_batch=true", "search.only=true", "search.probe=account",
              "memory.limit_gb=10", "search.candidates=[1,2,4,8,64]", f"results_dir={tmp_path}"])
    searched = read_records(tmp_path)[-1]
    assert searched["search"]["max_batch_size"] == searched["batch_size"] == 3
    assert [t["batch_size"] for t in searched["search"]["trials"]] == [1, 2, 3]


# The run in a child process that sends itself SIGTERM (as SLURM does) while generating.
TERMINATED_WHILE_RUNNING = textwrap.dedent("""
    import os, signal, sys
    from kvbench import cli
    from kvbench import run as kvrun
    execute = kvrun.static.execute
    def execute_then_term(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return execute(*args, **kwargs)
    kvrun.static.execute = execute_then_term
    cli.main(sys.argv[1:])
""")


def test_sigterm_leaves_an_interrupted_record(tmp_path):
    """Case 6: SIGTERM is handled like Ctrl-C: an `interrupted` record, then the process stops (143)."""
    p = subprocess.run([sys.executable, "-c", TERMINATED_WHILE_RUNNING, *TINY, f"results_dir={tmp_path}"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 143, p.stderr[-2000:]
    (rec,) = read_records(tmp_path)
    assert (rec["status"], rec["error"]) == ("interrupted", "interrupted: SIGTERM")
    assert "Traceback" not in p.stderr


# Waits for its twin at a barrier, then sweeps; each run takes a second, so the twins overlap.
TWIN = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from kvbench import cli
    from kvbench import run as kvrun
    barrier = Path(sys.argv[1])
    (barrier / str(os.getpid())).touch()
    while len(list(barrier.iterdir())) < 2:
        time.sleep(0.05)
    execute = kvrun.static.execute
    def slow_execute(*args, **kwargs):
        time.sleep(1.5)
        return execute(*args, **kwargs)
    kvrun.static.execute = slow_execute
    cli.main(sys.argv[2:])
""")


def test_two_identical_sweeps_at_once_run_each_configuration_once(tmp_path):
    """Case 7: the same sweep started twice at once: one record per configuration, two sweep dirs."""
    (tmp_path / "barrier").mkdir()
    cmd = [sys.executable, "-c", TWIN, str(tmp_path / "barrier"), "-m", *TINY, "policy=full,window",
           f"results_dir={tmp_path / 'results'}"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    records = read_records(tmp_path / "results")
    assert sorted(r["policy"] for r in records) == ["full", "window"]
    assert all(r["status"] == "ok" for r in records)
    sweep_dirs = list((tmp_path / "results" / "hydra").glob("*/*-multirun"))
    assert len(sweep_dirs) == 2, sweep_dirs
    assert not list((tmp_path / "results" / "claims").iterdir())  # every claim released


def test_sigterm_while_the_record_is_written_waits_for_it(tmp_path, monkeypatch):
    """Case 6: a SIGTERM that arrives while the record is being written never tears it: written, then exit."""
    import os
    import signal

    from hydra import compose, initialize_config_dir

    from kvbench import results
    from kvbench.config import CONF_DIR

    append = results.append_record

    def term_then_append(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # delivered at once, in the middle of the write path
        return append(*args, **kwargs)

    monkeypatch.setattr(results, "append_record", term_then_append)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[*TINY, f"results_dir={tmp_path}"])
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exc:
        kvrun.run(cfg)
    assert exc.value.code == 143 and signal.getsignal(signal.SIGTERM) is before  # the handler is put back
    (rec,) = read_records(tmp_path)
    assert rec["status"] == "ok" and rec["metrics"]  # the finished run's record, whole
