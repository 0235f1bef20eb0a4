"""Models from the Hugging Face Hub (Llama-2-13b-chat, Phi-3.5-mini-instruct), for users with GPUs.

`device_map=auto` splits the layers over every visible GPU (accelerate), with an optional per-GPU
`max_memory` such as {0: "30GiB", 1: "30GiB"}; kvbench then puts each layer's KV cache on that
layer's device.
"""

from __future__ import annotations

from kvbench.models.base import LoadedModel, finish, resolve_device, resolve_dtype


def weights(model_cfg, dtype: str) -> str:
    return f"Hub checkpoint {model_cfg.get('pretrained')}, loaded as {dtype}"


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
            kwargs["max_memory"] = {(int(k) if str(k).isdigit() else k): v for k, v in dict(max_memory).items()}
    tok = AutoTokenizer.from_pretrained(pretrained, revision=revision, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(pretrained, **kwargs)
    if "device_map" not in kwargs:
        model = model.to(dev)
    return finish(model, tok, name)
