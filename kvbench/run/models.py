"""The models a process has loaded, kept for its next run, and loading one under a memory limit.

Hydra's basic launcher runs a sweep's jobs in one process, so the model of the last run is kept (keyed
by its model config and device) and the next run of the same model reuses it; only one is kept, so a
sweep over models never holds two. `load_within` applies `memory.limit_gb`'s CUDA cap before loading
and checks the weights against the limit once loaded: a limit below the model itself is bad input
(`ModelDoesNotFit`, a ConfigError), not a measurement.
"""

from __future__ import annotations

import gc

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from kvbench import memory
from kvbench.memory import is_oom
from kvbench.models.loaded import LoadedModel

_models: dict[str, LoadedModel] = {}


def load_model(cfg: DictConfig) -> LoadedModel:
    """The model of `cfg`, reused if this process already loaded it (only one is kept)."""
    key = f"{OmegaConf.to_yaml(cfg.model)}|{cfg.device}"
    if key not in _models:
        _models.clear()
        gc.collect()
        _models[key] = instantiate(cfg.model, device=cfg.device, _convert_="all")
    return _models[key]


def load_within(cfg: DictConfig, memory_limit: memory.MemoryLimit | None, lm: LoadedModel | None = None) -> LoadedModel:
    """The model (loaded under the limit's CUDA cap unless given); ModelDoesNotFit if its weights exceed it.

    `memory_limit` is `memory.memory_limit_of(cfg)`: memory.limit_gb less memory.reserve_gb, or None (no limit).
    """
    memory.apply_cuda_cap(memory_limit)
    if lm is None:
        try:
            lm = load_model(cfg)
        except Exception as e:
            if memory_limit is None or not is_oom(e):
                raise
            raise memory.ModelDoesNotFit(
                "memory.limit_gb", "the model alone does not fit: loading it ran out of memory", memory_limit.gb
            ) from None
    if memory_limit is not None:
        memory_limit.check_weights(lm.model)
    return lm
