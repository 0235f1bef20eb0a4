"""hydra/launcher=slurm (hydra-submitit-launcher, the optional `slurm` extra): one SLURM job per sweep
job on one GPU node, its keys overridable. Composes where the plugin is installed; where it is not,
the test that needs it is skipped and the command line says what to install, in one line."""

import importlib.util

import pytest
from hydra import compose, initialize_config_dir

from kvbench import cli
from kvbench.config import CONF_DIR


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
