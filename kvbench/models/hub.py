"""Models from the Hugging Face Hub (the paper's Llama-2-13b-chat and Phi-3.5-mini-instruct, and the models
researchers load today: docs/models.md), for users with GPUs.

`device_map=auto` splits the layers over every visible GPU (accelerate), with an optional per-GPU
`max_memory` such as {0: "30GiB", 1: "30GiB"}; kvbench then puts each layer's KV cache on that
layer's device.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

import torch

from kvbench.errors import ConfigError
from kvbench.models import family
from kvbench.models.loaded import LoadedModel, ModelSpec, finish, resolve_device, resolve_dtype

# The `model=` choices' config.json, shipped so kvbench-plan needs no Hub (the weights still come from it)
SHIPPED_CONFIGS = {
    "meta-llama/Llama-2-13b-chat-hf": "Llama-2-13b-chat-hf.json",
    "microsoft/Phi-3.5-mini-instruct": "Phi-3.5-mini-instruct.json",
    "meta-llama/Llama-3.1-8B-Instruct": "Llama-3.1-8B-Instruct.json",
    "Qwen/Qwen3-8B": "Qwen3-8B.json",
    "mistralai/Mistral-7B-Instruct-v0.3": "Mistral-7B-Instruct-v0.3.json",
    "microsoft/Phi-3-mini-4k-instruct": "Phi-3-mini-4k-instruct.json",
    "microsoft/Phi-4-mini-instruct": "Phi-4-mini-instruct.json",
    "google/gemma-3-4b-it": "gemma-3-4b-it.json",  # the text decoder's config
    "openai/gpt-oss-20b": "gpt-oss-20b.json",
    "Qwen/Qwen3-30B-A3B": "Qwen3-30B-A3B.json",
    "mistralai/Ministral-3-8B-Instruct-2512": "Ministral-3-8B-Instruct-2512.json",  # the text decoder's config
    "zai-org/GLM-4-9B-0414": "GLM-4-9B-0414.json",
    "google/gemma-4-31B-it": "gemma-4-31B-it.json",  # the text decoder's config (a family kvbench refuses)
    "Qwen/Qwen3.5-27B": "Qwen3.5-27B.json",  # the text decoder's config (a family kvbench refuses)
    "Qwen/Qwen3.5-35B-A3B": "Qwen3.5-35B-A3B.json",  # the text decoder's config (a family kvbench refuses)
}
CONFIG_DIR = Path(__file__).parent / "configs"


HUB_TIMEOUT = 5.0  # seconds the Hub has to answer before a run that needs it is refused
_answers: dict[str, bool] = {}


def weights(model_cfg, dtype: str) -> str:
    return f"Hub checkpoint {model_cfg.get('pretrained')}, loaded as {dtype}"


def offline() -> bool:
    """HF_HUB_OFFLINE is set (read now, not when huggingface_hub was imported)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def check(model_cfg) -> None:
    """Before a run loads anything: the model is a local folder, in the local Hugging Face cache, or the Hub
    answers within HUB_TIMEOUT. Otherwise one line saying how to get it (transformers would retry for about
    a minute, then print a long error)."""
    pretrained = str(model_cfg.get("pretrained"))
    if Path(pretrained).expanduser().is_dir():
        return
    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(pretrained, "config.json", revision=model_cfg.get("revision")), str):
        return
    from kvbench.net import answers

    if offline() or not answers(constants.ENDPOINT, HUB_TIMEOUT, _answers):
        why = "HF_HUB_OFFLINE is set" if offline() else f"{constants.ENDPOINT} did not answer (waited up to {HUB_TIMEOUT:g} s)"
        raise ConfigError(
            "model.pretrained",
            f"is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) and the Hub cannot be reached ({why}): "
            f"download it where the Hub answers (`hf download {pretrained}`) and copy that cache here (HF_HOME), or "
            "give model.pretrained a local folder", pretrained,
        )


def tokenizer(model_cfg):
    """The model's tokenizer (checked like its weights first: offline, one line instead of a minute of retries)."""
    from transformers import AutoTokenizer

    check(model_cfg)

    return AutoTokenizer.from_pretrained(str(model_cfg.get("pretrained")), revision=model_cfg.get("revision"),
                                         trust_remote_code=bool(model_cfg.get("trust_remote_code", False)))


def load_hub(
    name: str,
    pretrained: str,
    dtype: str = "auto",
    device: str = "auto",
    device_map: str | None = "auto",
    max_memory: dict | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    kwargs = dict(dtype=torch_dtype, revision=revision, trust_remote_code=trust_remote_code)
    if dev.type == "cuda" and device_map:
        kwargs["device_map"] = device_map
        if max_memory:
            kwargs["max_memory"] = max_memory_of(max_memory)
    family.check(hub_config(pretrained, revision, trust_remote_code))  # a refused family: before any weight loads
    tok = AutoTokenizer.from_pretrained(pretrained, revision=revision, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(pretrained, **kwargs)
    if "device_map" not in kwargs:
        model = model.to(dev)
    return finish(model, tok, name)


def max_memory_of(max_memory: dict | None) -> dict | None:
    """model.max_memory as from_pretrained takes it: GPU indices as ints."""
    if not max_memory:
        return None
    return {(int(k) if str(k).isdigit() else k): v for k, v in dict(max_memory).items()}


@contextmanager
def quiet_transformers():
    """transformers' warnings unprinted while a config is built: notes to a model's authors (Phi-4-mini's longrope
    fields), printed before a preflight's one-line refusal or a plan's table they would say nothing to the user."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def hub_config(pretrained: str, revision: str | None = None, trust_remote_code: bool = False):
    """The model's config: the shipped copy for the models in SHIPPED_CONFIGS (offline), else the Hub's."""
    from transformers import AutoConfig

    if pretrained in SHIPPED_CONFIGS and revision is None:
        values = json.loads((CONFIG_DIR / SHIPPED_CONFIGS[pretrained]).read_text())
        values = {k: v for k, v in values.items() if not k.startswith("_")}
        with quiet_transformers():
            config = AutoConfig.for_model(values.pop("model_type"), **values)
        config.name_or_path = pretrained  # as from_pretrained names it (e.g. DuoAttention's pattern is looked up by it)
        return config
    check({"pretrained": pretrained, "revision": revision})  # not cached and no Hub: one line, no retries
    try:
        with quiet_transformers():
            return AutoConfig.from_pretrained(pretrained, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:  # no such repository, no config.json, a gated model...
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        raise ConfigError("model.pretrained", f"its config cannot be read: {first}", pretrained) from None


def hub_spec(
    name: str,
    pretrained: str,
    dtype: str = "auto",
    device: str = "auto",
    device_map: str | None = "auto",
    max_memory: dict | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> ModelSpec:
    """`load_hub`'s model without its weights (device: where it would run, cpu or cuda)."""
    from transformers import AutoTokenizer

    dev = torch.device(device)
    return ModelSpec(
        config=hub_config(pretrained, revision, trust_remote_code),
        dtype=resolve_dtype(dtype, dev),
        tokenizer=lambda: AutoTokenizer.from_pretrained(pretrained, revision=revision, trust_remote_code=trust_remote_code),
        device_map=device_map if dev.type == "cuda" else None,
        max_memory=max_memory_of(max_memory),
    )
