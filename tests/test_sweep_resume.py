"""Sweeps survive: a sweep killed mid-way and re-run finishes the rest with no duplicate records, a
failing run is recorded as an error and the sweep goes on, and skip_existing defaults to true for
sweeps only (an explicit value wins either way)."""

import subprocess
import sys
import textwrap

import pytest

from kvbench import cli, runner
from kvbench.results import read_records

TINY = ["model=tiny-llama", "task.n_samples=2", "task.context_tokens=32", "gen.max_new_tokens=2", "batch_size=2"]
SWEEP = ["-m", *TINY, "policy=full,window"]

# The sweep in a child process that dies by SIGKILL (no cleanup, no record) when its second run starts.
KILLED_ON_SECOND_RUN = textwrap.dedent("""
    import os, signal, sys
    from kvbench import cli, runner
    calls, execute = [], runner.execute
    def execute_then_die(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return execute(*args, **kwargs)
    runner.execute = execute_then_die
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
    execute = runner.execute

    def fail_full(cfg, *a, **k):
        if cfg.policy.kv_size is None:
            raise RuntimeError("boom in the full-cache run")
        return execute(cfg, *a, **k)

    monkeypatch.setattr(runner, "execute", fail_full)
    cli.main(args)  # no SystemExit: a sweep goes on past a failed run
    err, ok = read_records(tmp_path)
    assert (err["policy"], err["status"], err["error"]) == ("full", "error", "RuntimeError: boom in the full-cache run")
    assert (ok["policy"], ok["status"]) == ("window", "ok")

    monkeypatch.setattr(runner, "execute", execute)
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
