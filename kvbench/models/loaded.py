"""What a loader returns, and the device/dtype resolution shared by loaders."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvbench.errors import ConfigError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


@dataclass
class LoadedModel:
    model: object
    tokenizer: object
    name: str
    eos_token_ids: list[int] = field(default_factory=list)
    pad_token_id: int = 0

    @property
    def weights_bytes(self) -> int:
        m = self.model
        return sum(p.numel() * p.element_size() for p in m.parameters()) + sum(
            b.numel() * b.element_size() for b in m.buffers()
        )

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @functools.cached_property
    def kinds(self):
        """The model's attention kinds (kvbench.models.family.kinds), read once for every use of this model."""
        from kvbench.models.family import kinds

        return kinds(self.model.config)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))


@dataclass
class ModelSpec:
    """What a loader would load, without loading it: the config, the dtype, the tokenizer on demand and
    the placement arguments (`device_map`, `max_memory`) of its `from_pretrained` call. kvbench-plan builds
    the model from it on the meta device."""

    config: object  # transformers PretrainedConfig
    dtype: torch.dtype
    tokenizer: Callable[[], object]
    device_map: str | None = None
    max_memory: dict | None = None

    def meta_model(self):
        """The model on the meta device: every parameter and buffer with its shape and dtype, no storage."""
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(self.config, dtype=self.dtype)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device", "CUDA was asked for but no GPU is visible", device)
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise ConfigError("device", "must be auto, cpu or cuda[:N]", device)
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ConfigError("model.dtype", f"must be auto or one of {', '.join(DTYPES)}", dtype)
    return DTYPES[dtype]


def finish(model, tokenizer, name: str) -> LoadedModel:
    """Eval mode, EOS from the generation config, a pad id for batching."""
    model.eval()
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    eos_ids = [] if eos is None else (list(eos) if isinstance(eos, (list, tuple)) else [int(eos)])
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = getattr(gen, "pad_token_id", None)
    if pad is None:
        pad = eos_ids[0] if eos_ids else 0
    if isinstance(pad, (list, tuple)):
        pad = pad[0]
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, eos_token_ids=eos_ids, pad_token_id=int(pad))
