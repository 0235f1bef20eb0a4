"""kvbench.run.life: the patch points kvbench.run's docstring names really are where the life cycle looks
(a test that patches a shim instead would test nothing), and what fails inside the run is recorded."""

from __future__ import annotations

from hydra import compose, initialize_config_dir

from kvbench.config import CONF_DIR
from kvbench.results import read_records
from kvbench.run import models, run, static

TINY = ["model=tiny-llama", "device=cpu", "task.n_samples=2", "task.context_tokens=32", "gen.max_new_tokens=2",
        "batch_size=2"]


def _cfg(tmp_path, *overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=[*TINY, f"results_dir={tmp_path}", *overrides])


def _boom(what):
    def fail(*a, **k):
        raise RuntimeError(f"{what} patched")

    return fail


def test_a_patched_model_load_is_the_one_a_run_uses(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "load_model", _boom("load_model"))
    rec = run(_cfg(tmp_path))
    assert (rec["status"], rec["error"]) == ("error", "RuntimeError: load_model patched")
    assert read_records(tmp_path)[0]["run_id"] == rec["run_id"]


def test_a_patched_execute_is_the_one_mode_run_uses(tmp_path, monkeypatch):
    monkeypatch.setattr(static, "execute", _boom("execute"))
    rec = run(_cfg(tmp_path))
    assert rec["error"] == "RuntimeError: execute patched" and rec["batch_size"] == 2 and rec["prompts"]["n"] == 2

