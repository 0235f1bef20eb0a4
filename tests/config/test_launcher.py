"""hydra/launcher=slurm (hydra-submitit-launcher, the optional `slurm` extra, also in `dev`): one SLURM
job per sweep job on one GPU node, its keys overridable. Composes where the plugin is installed; where
it is not, the test that needs it is skipped and the command line says what to install, in one line.
Beyond one machine for real: a sweep through `hydra/launcher=submitit_local` (submitit's own code path,
one process per job, the queue aside) writes both jobs' records into one results directory, and a
job stopped by SIGTERM leaves its `interrupted` record."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from kvbench import cli
from kvbench.config import CONF_DIR
from kvbench.results import read_records

ROOT = Path(__file__).resolve().parents[2]


def _has_plugin() -> bool:
    try:
        return importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None
    except ModuleNotFoundError:  # no hydra_plugins package at all
        return False


HAS_PLUGIN = _has_plugin()


@pytest.mark.skipif(not HAS_PLUGIN, reason="hydra-submitit-launcher is not installed (pip install 'kvbench[slurm]')")
def test_slurm_launcher_composes_with_overrides(tmp_path):
    overrides = ["hydra/launcher=slurm", "experiment=paper_llama2_cnndm", f"results_dir={tmp_path}",
                 "hydra.launcher.partition=gpu", "hydra.launcher.timeout_min=60", "hydra.launcher.gpus_per_node=4"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (launcher.partition, launcher.timeout_min, launcher.gpus_per_node) == ("gpu", 60, 4)
    assert (launcher.nodes, launcher.tasks_per_node) == (1, 1)  # one node, one process per job
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        default = compose("config", overrides=["hydra/launcher=slurm"], return_hydra_config=True).hydra.launcher
    assert (default.gpus_per_node, default.partition, default.timeout_min) == (1, None, 720)


@pytest.mark.skipif(HAS_PLUGIN, reason="the plugin is installed: its absence cannot be tested here")
def test_without_the_plugin_one_line_says_what_to_install(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        cli.main(["-m", "hydra/launcher=slurm", "model=tiny-llama", f"results_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "\n" not in err
    assert err == "kvbench: error: hydra/launcher: SLURM needs the hydra-submitit-launcher plugin " \
                  "(pip install 'kvbench[slurm]')"


@pytest.mark.skipif(not HAS_PLUGIN, reason="hydra-submitit-launcher is not installed (pip install 'kvbench[dev]')")
def test_submitit_local_sweep_writes_both_records_and_sigterm_leaves_one(tmp_path):
    """Two jobs, each its own submitit process, into one results dir; the evicting one gets SIGTERM mid-run."""
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "kvbench", "-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10",
           "model=tiny-llama", "task.n_samples=2", "task.context_tokens=32", "gen.max_new_tokens=2", "batch_size=2",
           "policy=full,window", f"results_dir={results}",
           "+hydra.callbacks.term._target_=tests.sweep_hooks.TermEvictingRun"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=480)
    by_policy = {r["policy"]: r for r in read_records(results)}
    assert sorted(by_policy) == ["full", "window"], p.stderr[-3000:]
    assert by_policy["full"]["status"] == "ok"
    assert (by_policy["window"]["status"], by_policy["window"]["error"]) == ("interrupted", "interrupted: SIGTERM")
    assert p.returncode != 0  # the sweep says that a job did not finish
    (sweep,) = (results / "hydra").glob("*/*-multirun")  # one sweep dir; each job's outputs under it
    assert (sweep / "0" / ".hydra").is_dir() and (sweep / "1" / ".hydra").is_dir()
    jobs = sorted(d for d in (sweep / ".submitit").iterdir() if d.name.isdigit())  # a job's id: its process id
    assert len(jobs) == 2 and [len(list(j.glob("*_result.pkl"))) for j in jobs].count(1) == 1  # one finished
    assert "interrupted by SIGTERM: recorded, exiting" in "".join(
        f.read_text() for j in jobs for f in j.glob("*_log.*"))
    assert not list((results / "claims").iterdir())  # the stopped job released its claim
