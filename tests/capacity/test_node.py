"""kvbench.capacity.node: the node a plan describes, in bytes worked out by hand here."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from kvbench.capacity import node_of
from kvbench.config import CONF_DIR
from kvbench.errors import ConfigError

GiB, MiB = 2**30, 2**20


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=["model=tiny-llama", "device=cpu", *overrides])


def test_a_cpu_node_is_its_accounted_limit_less_the_reserve():
    node = node_of(_cfg("memory.limit_gb=2", "memory.reserve_gb=0.5"))
    assert (node.memory_limit, node.usable, node.max_memory, node.gpu) == ({"cpu": 2 * GiB}, {"cpu": GiB + GiB // 2},
                                                                            None, False)
    assert node.describe() == "CPU, accounted memory limit 2048 MiB"


def test_gpus_by_count_and_memory():
    node = node_of(_cfg("plan.gpus=2", "plan.gpu_mem_mib=1000", "memory.reserve_gb=0.25"))
    assert node.max_memory == {0: 1000 * MiB, 1: 1000 * MiB}
    assert node.usable == {"cuda:0": 1000 * MiB - GiB // 4, "cuda:1": 1000 * MiB - GiB // 4}
    assert node.describe() == "2 x GPU 1000 MiB"


def test_model_max_memory_is_capped_by_the_limit():
    node = node_of(_cfg("+model.max_memory={0: 4GiB, 1: 1GiB}", "memory.limit_gb=2"))
    assert node.max_memory == {0: 4 * GiB, 1: GiB}  # placement sees the cards
    assert node.memory_limit == {"cuda:0": 2 * GiB, "cuda:1": GiB}  # the account sees the limit


@pytest.mark.parametrize("overrides, key", [
    ([], "memory.limit_gb"),  # a CPU plan needs a limit
    (["plan.gpus=2"], "plan.gpu_mem_mib"),  # GPUs without their memory
    (["plan.gpus=1", "plan.gpu_mem_mib=1024", "memory.reserve_gb=1"], "memory.reserve_gb"),  # nothing left
])
def test_a_node_that_cannot_be_planned_names_the_key(overrides, key):
    with pytest.raises(ConfigError) as e:
        node_of(_cfg(*overrides))
    assert e.value.key == key
