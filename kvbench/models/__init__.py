"""Model loading: each `model=` config names one of these loaders as its `_target_`.

Every loader returns a `LoadedModel`: the transformers model in eval mode, its tokenizer, and the
ids kvbench needs (EOS from the generation config, a pad id), so the engine never guesses.
"""

from kvbench.models.base import LoadedModel, resolve_device, resolve_dtype
from kvbench.models.gguf import load_gguf_package
from kvbench.models.hub import load_hub
from kvbench.models.tiny import build_tiny

__all__ = ["LoadedModel", "resolve_device", "resolve_dtype", "load_gguf_package", "load_hub", "build_tiny"]
