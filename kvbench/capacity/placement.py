"""The model without weights, placed per device as `from_pretrained(device_map="auto")` would place it.

The model is built on the meta device from its loader's weight-free twin (kvbench.models.SPECS), so every
parameter has its real shape and dtype and none has storage; transformers' own `_get_device_map`
(accelerate's balanced `max_memory`, then `infer_auto_device_map`) splits it over the node's GPUs; a loader
that does not split (GGUF, tiny) puts everything on one device, as it does when it loads. The result is
the memory account's ModelShape with weights and decoder layers per device.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf

from kvbench import memory
from kvbench.capacity.node import Node
from kvbench.errors import ConfigError


def spec_of(cfg: DictConfig, node: Node):
    """The model of `cfg` without weights (its loader's twin in kvbench.models.SPECS), for where the node runs it."""
    from kvbench.models import SPECS

    loader = get_method(cfg.model._target_)
    if loader not in SPECS:
        raise ConfigError("model", f"{cfg.model._target_} has no weight-free spec for planning", cfg.model.name)
    args = {k: v for k, v in OmegaConf.to_container(cfg.model, resolve=True).items() if k != "_target_"}
    return SPECS[loader](**{**args, "device": "cuda" if node.gpu else "cpu"})


def placement(model, spec, node: Node) -> dict[str, str]:
    """Module name -> device ("cuda:i" / "cpu") as `from_pretrained(device_map=..., max_memory=...)` would place it."""
    if not node.gpu:
        return {"": "cpu"}
    if not spec.device_map:  # loaders that do not split move the whole model to one GPU
        return {"": "cuda:0"}
    from transformers.integrations.accelerate import _get_device_map

    quiet = logging.getLogger("accelerate.utils.modeling")  # "Device 0 is not available": this machine's GPUs
    level, quiet.level = quiet.level, logging.ERROR
    try:
        dmap = _get_device_map(model, spec.device_map, dict(node.max_memory), None)
    finally:
        quiet.level = level
    off = sorted({str(v) for v in dmap.values() if not isinstance(v, int)})
    if off:
        raise ConfigError("plan.gpu_mem_mib", f"the weights do not fit on {node.describe()}: device_map would put"
                          f" part of the model on {', '.join(off)}", None)
    return {k: f"cuda:{v}" for k, v in dmap.items()}


def _device(name: str, dmap: dict[str, str]) -> str:
    """The device of a parameter or module: its longest prefix in the device map."""
    while True:
        if name in dmap:
            return dmap[name]
        if not name:
            raise KeyError(name)
        name = name.rpartition(".")[0]


def placed_shape(model, dmap: dict[str, str]) -> memory.ModelShape:
    """The account's ModelShape of a meta model placed by `dmap`: weights and decoder layers per device."""
    weights: dict[str, int] = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:  # tied weights are yielded once
        d = _device(name, dmap)
        weights[d] = weights.get(d, 0) + t.numel() * t.element_size()
    stack = model.get_decoder().layers
    prefix = next(n for n, m in model.named_modules() if m is stack)
    layers: dict[str, int] = {}
    for i in range(len(stack)):
        d = _device(f"{prefix}.{i}", dmap)
        layers[d] = layers.get(d, 0) + 1
    return replace(memory.ModelShape.of(model), weights=weights, layers=layers)
