"""Model loading: each `model=` config names one of these loaders as its `_target_`.

Every loader returns a `LoadedModel`: the transformers model in eval mode, its tokenizer, and the
ids kvbench needs (EOS from the generation config, a pad id), so the engine never guesses.
"""

from kvbench.models.base import LoadedModel, ModelSpec, resolve_device, resolve_dtype
from kvbench.models.gguf import gguf_spec, load_gguf_package
from kvbench.models.hub import hub_spec, load_hub
from kvbench.models.tiny import build_tiny, tiny_spec

# each loader's weight-free twin (kvbench-plan): same arguments, returns a ModelSpec
SPECS = {load_hub: hub_spec, load_gguf_package: gguf_spec, build_tiny: tiny_spec}

__all__ = ["LoadedModel", "ModelSpec", "SPECS", "resolve_device", "resolve_dtype", "load_gguf_package", "load_hub",
           "build_tiny", "gguf_spec", "hub_spec", "tiny_spec"]
