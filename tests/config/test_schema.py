"""Every option of every config group composes and validates (no model is loaded)."""

import pytest
from hydra import compose, initialize_config_dir

from kvbench.config import CONF_DIR, build_policy, prepare
from kvbench.policies import registry

GROUPS = {g: sorted(p.stem for p in (CONF_DIR / g).glob("*.yaml")) for g in ("model", "task", "policy", "logger")}


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize("group,option", [(g, o) for g, opts in GROUPS.items() for o in opts])
def test_every_option_composes(group, option, tmp_path):
    overrides = [f"{group}={option}", f"results_dir={tmp_path}"]
    if group == "task" and option != "passkey":
        from tests.tasks import ruler_shards
        from tests.tasks.test_fewshot import write_mirror

        mirror = write_mirror(tmp_path / "data")
        ruler_shards.mirror(mirror)  # RULER's essays and QA sets: a data.dir without them is refused
        overrides.append(f"data.dir={mirror}")
    cfg = _compose(*overrides)
    prepare(cfg)


def test_every_policy_has_a_config_and_a_class():
    assert set(GROUPS["policy"]) == set(registry())
    for name in GROUPS["policy"]:
        assert build_policy(_compose(f"policy={name}")).name == name


def test_interface_defaults():
    cfg = _compose()
    assert cfg.model.name == "smollm2-135m" and cfg.batch_size == 1 and cfg.results_dir == "outputs"
    assert cfg.data.dir is None and cfg.memory.limit_gb is None and cfg.search.max_batch is False
    assert cfg.output.save_prompt_ids is False and cfg.device == "auto"


def test_experiment_overrides_root_values():
    """An experiment file wins over the root config's own values (results_dir, device, ...)."""
    cfg = _compose("experiment=mini_cnndm")
    assert cfg.results_dir == "outputs/mini" and cfg.device == "cpu"
    assert _compose("experiment=mini_cnndm", "results_dir=elsewhere").results_dir == "elsewhere"  # CLI wins
