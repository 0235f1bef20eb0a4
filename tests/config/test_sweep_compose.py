"""A sweep's jobs composed once per choice of config groups equal Hydra's own compose, job by job."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from kvbench.config import CONF_DIR
from kvbench.config.sweep_compose import compose_each

GROUPS = {p.name for p in CONF_DIR.iterdir() if p.is_dir()}
SWEEPS = {
    "grid": ["experiment=kvpress_ruler_llama31", "task=niah_single_1,niah_single_2", "policy=snapkv,tova,full",
             "++policy.compression_ratio=0.25,0.5", "++policy.schedule=after_prefill,prefill_and_decode"],
    "add_delete": ["policy=h2o,batch_max", "++policy.kv_size=16,32", "+gen.extra=1", "~policy.rerotate",
                   "gen.max_new_tokens=3,5", "batch_size=2"],
    "node_then_key": ["task=gsm8k", "gen={max_new_tokens:2}", "gen.max_new_tokens=4,6"],
    "key_then_node": ["task=gsm8k", "gen.max_new_tokens=4,6", "gen={max_new_tokens:2}"],
    "experiment_values": ["experiment=mini_cnndm,mini_gsm8k", "task.n_samples=2,3", "policy.kv_size=24"],
}


def jobs_of(overrides: list[str]) -> list[list[str]]:
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [list(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


@pytest.mark.parametrize("name", SWEEPS)
def test_every_job_equals_hydras_compose(name):
    jobs = jobs_of(SWEEPS[name])
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="kvbench"):
        want = [compose(config_name="config", overrides=job) for job in jobs]
        got = compose_each("config", jobs, GROUPS)
    assert len(jobs) > 1 and len(got) == len(want)
    for job, g, w in zip(jobs, got, want, strict=True):
        assert OmegaConf.to_yaml(g) == OmegaConf.to_yaml(w), job
        assert OmegaConf.is_struct(g) == OmegaConf.is_struct(w), job
    got[0].batch_size = 99  # each job's config is its own
    assert all(c.batch_size != 99 for c in got[1:])


def test_a_job_hydra_refuses_is_refused():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="kvbench"):
        with pytest.raises(Exception, match="policy.no_such_key|no_such_key"):
            compose_each("config", [["policy=h2o", "policy.no_such_key=1"]], GROUPS)
