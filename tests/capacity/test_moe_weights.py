"""MoE routing does not touch the cache; the planner charges every expert's weights.

kvbench-plan builds the model on the meta device from its config: for a tiny model of each MoE family kvbench runs
(the family matrix's), the planned weights are exactly the bytes of the same model built with its weights, and the
experts' parameters in it are every expert of every MoE layer (a count written from the config alone: E experts of
gate, up and down projections, H x I each), not the experts a token is routed to.
"""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from kvbench import capacity
from kvbench.config import CONF_DIR
from kvbench.models import build_tiny


def _plan_inputs(arch: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["model=tiny-llama", f"model.arch={arch}", "device=cpu", "memory.limit_gb=1",
                                           "task.n_samples=2", "task.context_tokens=40"])
    node, spec, model, shape, _, _ = capacity.plan_inputs(cfg)
    return spec, model, shape


def _moe_layers(cfg) -> int:
    dense = getattr(cfg, "first_k_dense_replace", 0) or 0  # GLM-4-MoE: the first layers' MLPs are dense
    return cfg.num_hidden_layers - dense


def _experts(cfg) -> tuple[int, int]:
    """(experts per MoE layer, the intermediate size of one expert), from the config."""
    n = next(getattr(cfg, k) for k in ("num_local_experts", "num_experts", "n_routed_experts") if getattr(cfg, k, None))
    size = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    return n, size


@pytest.mark.parametrize("arch", ["mixtral", "qwen3-moe", "glm4-moe", "gpt-oss"])
def test_the_plan_charges_every_experts_weights(arch):
    spec, meta, shape = _plan_inputs(arch)
    real = build_tiny(f"tiny-{arch}", arch=arch, device="cpu")
    assert shape.weights == {"cpu": real.weights_bytes}  # the meta model's bytes are the loaded model's
    assert sum(p.numel() for p in meta.parameters()) == sum(p.numel() for p in real.model.parameters())
    cfg = spec.config
    n, size = _experts(cfg)
    expert_params = sum(p.numel() for name, p in meta.named_parameters() if ".experts." in name and "bias" not in name)
    assert n > cfg.num_experts_per_tok  # a routed subset would be fewer
    assert expert_params == _moe_layers(cfg) * n * 3 * cfg.hidden_size * size
