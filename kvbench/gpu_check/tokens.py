"""The GPU checks that compare tokens: parity with `model.generate`, serve mode, accelerate's offload, device maps.

Each runs kvbench on CUDA and judges the tokens with `checks.compare_tokens` (a divergence passes only at a
near tie of the reference) or `checks.device_map_check`. `parity_cases` runs on any device (the tests run it
on a tiny CPU model); the others need a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvbench.gpu_check.fixtures import compose, load, reference, text_prompts
from kvbench.gpu_check.verdicts import (
    TIE_MARGIN,
    available_backends,
    backend_runs,
    compare_tokens,
    device_map_check,
    split_device_map,
)


def parity_cases(lm, prompts, backends: Sequence[str], tie: float, new_tokens: int, label: str,
                 policy=None) -> list[dict]:
    """kvbench vs model.generate at batch 1 and 4 for each backend (any device). `policy`: one that never
    evicts at these lengths (default: the full cache); a scored one (H2O with a large budget) runs the
    statistics path too, and makes `fused` the fused kernel instead of SDPA."""
    from kvbench import engine
    from kvbench.policies import Full

    out = []
    for backend in backends:
        for B in (1, 4):
            gen = engine.generate(lm.model, lm.tokenizer, prompts[:B], policy or Full(), B, max_new_tokens=new_tokens,
                                  eos_token_ids=lm.eos_token_ids, attention=backend)
            ref, margins = reference(lm, prompts[:B], new_tokens)
            out.append({"check": "parity", "case": f"{backend}-{label}-b{B}", "ran": gen.attention,
                        **compare_tokens(gen.token_ids, ref, margins, tie)})
    return out


def check_parity(args) -> list[dict]:
    """The full cache on every backend in float16 and float32 (flash in half only); a scored policy that never
    evicts in float16 (the fused kernel, flash/SDPA + the statistics pass); an evicting policy's tokens on CUDA
    == on the CPU in float32 (same algorithm, two devices: the CUDA-only paths of eviction)."""
    from kvbench import engine
    from kvbench.attention import BACKENDS, flash_available
    from kvbench.policies import H2O, BatchMax

    out = []
    for dtype in ("float16", "float32"):
        lm = load(dtype)
        prompts = text_prompts(lm.tokenizer, (300, 181, 257, 96))
        backends = [b for b in available_backends(BACKENDS, flash_available()) if backend_runs(b, dtype)]
        out += parity_cases(lm, prompts, backends, TIE_MARGIN[dtype], args.new_tokens, dtype)
        if dtype == "float16":
            scored = H2O(kv_size=1024, evict_every=64)  # never full at these lengths: the full cache's tokens
            out += parity_cases(lm, prompts, [b for b in backends if b != "eager"], TIE_MARGIN[dtype], args.new_tokens,
                                "h2o-noevict-float16", policy=scored)
        del lm
    cuda, cpu = load("float32"), load("float32", "cpu")
    prompts = text_prompts(cuda.tokenizer, (300, 181, 257, 96))
    for name, policy in (("batch_max", BatchMax(kv_size=128, evict_every=32)), ("h2o", H2O(kv_size=128, evict_every=32))):
        got = [engine.generate(m.model, m.tokenizer, prompts, policy, 4, max_new_tokens=args.new_tokens,
                               eos_token_ids=m.eos_token_ids, attention="sdpa").token_ids for m in (cuda, cpu)]
        out.append({"check": "parity", "case": f"evict-{name}-float32-cuda-vs-cpu-b4",
                    **compare_tokens(got[0], got[1], None, 0.0)})
    return out


def check_serve(args) -> list[dict]:
    """mode=serve on CUDA: each request's tokens == model.generate's on its own prompt (paged SDPA, and paged
    flash with 256-slot blocks when flash-attn runs), in float16, near ties allowed."""
    import torch

    from kvbench.policies import Full
    from kvbench.serve import paged_attention as paged
    from kvbench.serve.engine import serve
    from kvbench.serve.request import Request

    lm = load("float16")
    prompts = text_prompts(lm.tokenizer, (300, 181, 257, 96))
    refs = [reference(lm, [p], args.new_tokens) for p in prompts]
    ref, margins = [r[0][0] for r in refs], [r[1][0] for r in refs]
    out = []
    for block in (16, 256):
        reqs = [Request(rid=i, prompt=list(p), max_new_tokens=args.new_tokens) for i, p in enumerate(prompts)]
        so = serve(lm.model, reqs, Full(), num_blocks=4096 // block * 2, block_size=block, max_tokens_per_step=512,
                   eos_token_ids=lm.eos_token_ids)
        ran = paged.backend(torch.device("cuda"), torch.float16, False, block)
        out.append({"check": "serve", "case": f"{ran}-block{block}-float16", "preemptions": so.preemptions,
                    **compare_tokens([r.output for r in reqs], ref, margins, TIE_MARGIN["float16"])})
    return out


def check_offload(args) -> list[dict]:
    """A layer offloaded to CPU RAM by accelerate (its parameters on meta between forwards; 13B on one 24 GB card
    runs so): the same tokens as the model on the GPU alone, its cache on the GPU, its weights on no device."""
    from accelerate import dispatch_model

    from kvbench import engine, memory
    from kvbench.policies import BatchMax

    lm = load("float16")
    prompts = text_prompts(lm.tokenizer, (300, 181, 257, 96))
    policy = BatchMax(kv_size=128, evict_every=32)
    want = engine.generate(lm.model, lm.tokenizer, prompts, policy, 4, max_new_tokens=args.new_tokens,
                           eos_token_ids=lm.eos_token_ids).token_ids
    lm.model.to("cpu")
    dec = lm.model.get_decoder()
    dm = split_device_map(len(dec.layers), 1, hasattr(dec, "rotary_emb"))
    dm["model.layers.1"] = "cpu"
    lm.model = dispatch_model(lm.model, device_map=dm, main_device="cuda:0")
    shape = memory.ModelShape.of(lm.model)
    got = engine.generate(lm.model, lm.tokenizer, prompts, policy, 4, max_new_tokens=args.new_tokens,
                          eos_token_ids=lm.eos_token_ids).token_ids
    r = compare_tokens(got, want, None, 0.0)
    ok = r["ok"] and "meta" not in shape.weights and shape.onload.get("cuda:0", 0) > 0
    return [{"check": "offload", **r, "ok": ok, "weights_per_device": shape.weights, "onload": shape.onload}]


def check_device_map(args, tmp) -> list[dict]:
    """(>= 2 GPUs) the layers split over the GPUs by accelerate: the same tokens as one GPU, a peak per device."""
    import torch
    from accelerate import dispatch_model

    from kvbench import run as kvrun
    from kvbench.results import read_jsonl

    n = torch.cuda.device_count()
    common = ["device=cuda", "model.dtype=float16", "task=passkey", "task.context_tokens=512", "task.n_samples=4",
              "batch_size=4", f"gen.max_new_tokens={args.new_tokens}", "policy=batch_max", "policy.kv_size=256"]
    one = kvrun.run(compose(*common, f"results_dir={tmp}/one"))
    lm = load("float16")
    lm.model.to("cpu")
    dm = split_device_map(len(lm.model.get_decoder().layers), n, hasattr(lm.model.get_decoder(), "rotary_emb"))
    lm.model = dispatch_model(lm.model, device_map=dm)
    split = kvrun.run(compose(*common, f"results_dir={tmp}/split"), lm=lm)
    tokens = [[row["token_ids"] for row in read_jsonl(r["predictions_path"])] if r.get("predictions_path") else []
              for r in (one, split)]
    r = device_map_check(tokens[0], tokens[1], split.get("peak_mem_bytes_per_device"))
    return [{"check": "device_map", "gpus": n, "statuses": [one["status"], split["status"]], **r}]
