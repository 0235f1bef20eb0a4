"""The GPU checks that measure resources: memory against the account, host syncs, the real-OOM search.

`check_memory` compares the account's transient with CUDA's allocated and reserved peaks; `check_syncs`
counts synchronising CUDA calls per decode step; `check_search_and_two_batches` runs the batch-size search
under CUDA's own cap (a memory limit set between two candidates' accounted peaks) and two batches at the
size it found. The search glue runs on any device (the tests run it on a tiny CPU model with the defaults).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvbench.gpu_check.fixtures import compose, load, policies, run_measured, text_prompts
from kvbench.gpu_check.verdicts import (
    SEARCH_MAX,
    memory_ratio,
    predicted_search,
    runs_check,
    search_check,
    search_samples,
    syncs_check,
    transient_check,
)

GPU = ("device=cuda", "model.dtype=float16")


def check_memory(args) -> list[dict]:
    """The account's transient against max_memory_allocated's and max_memory_reserved's, per policy and batch."""
    from kvbench import memory

    lm = load("float16")
    devices = memory.cuda_devices(lm.model)
    out = []
    for name, policy in policies().items():
        for B in (1, 4, 16):
            prompts = text_prompts(lm.tokenizer, [args.prompt_tokens] * B)
            res, allocated, reserved = run_measured(lm, policy, prompts, args.new_tokens, devices)
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

    lm = load("float16")
    prompts = text_prompts(lm.tokenizer, (args.prompt_tokens, 700, 900, 512))
    devices = memory.cuda_devices(lm.model)
    pols = policies()
    per_step = {}
    for name in ("batch_max", "pyramidkv", "h2o", "full"):
        n = [count_syncs(lambda k=k, p=pols[name]: run_measured(lm, p, prompts, k, devices, ignore_eos=False))
             for k in (32, 96)]
        per_step[name] = round((n[1] - n[0]) / 64, 4)
    return [{"check": "syncs", **syncs_check(per_step, 1 / engine.EOS_CHECK_EVERY + 1e-9)}]


def check_search_and_two_batches(args, tmp, base: Sequence[str] = GPU) -> list[dict]:
    """`base`: the model and device overrides (the GPU's; tests run the same glue on a tiny CPU model)."""
    from kvbench import memory, search
    from kvbench.config import build_policy, build_task, search_candidates
    from kvbench.run.models import load_model

    n_samples = search_samples(args.budget_batch)  # the search caps its candidates at the sample count
    common = [*base, "task=passkey", f"task.context_tokens={args.prompt_tokens}",
              f"task.n_samples={n_samples}", f"gen.max_new_tokens={args.new_tokens}", "gen.ignore_eos=true",
              "policy=full", "search.candidates=divisors_of_960", f"search.max={SEARCH_MAX}", f"results_dir={tmp}"]
    cfg = compose(*common)
    lm = load_model(cfg)
    task, policy = build_task(cfg), build_policy(cfg)
    ids = [task.encode(lm.tokenizer, s.prompt) for s in task.samples(lm.tokenizer)]
    candidates = search_candidates(cfg)

    def accounted(b):
        return memory.account(lm.model, [len(x) for x in search.probe_prompts(ids, b)], policy,
                              max_new_tokens=cfg.gen.max_new_tokens, prefill_chunk=cfg.gen.prefill_chunk,
                              score_chunk=cfg.gen.score_chunk).total

    # a memory limit halfway between the accounted peaks of --budget-batch and the next candidate
    i = candidates.index(args.budget_batch)  # search_samples made sure it and the next one are candidates
    memory_limit_gb = (accounted(candidates[i]) + accounted(candidates[i + 1])) / 2 / memory.GiB
    fits = {b: accounted(b) <= memory_limit_gb * memory.GiB for b in candidates}
    predicted, predicted_b0 = predicted_search(candidates, fits)
    try:
        return _search_and_two_batches(common, lm, memory_limit_gb, candidates, predicted, predicted_b0)
    finally:
        memory.apply_cuda_cap(None)  # the later checks run uncapped


def _search_and_two_batches(common, lm, memory_limit_gb, candidates, predicted, predicted_b0) -> list[dict]:
    from kvbench import run as kvrun

    limit = f"memory.limit_gb={memory_limit_gb}"
    rec = kvrun.run(compose(*common, "search.max_batch=true", "search.only=true", limit), lm=lm)
    s = rec.get("search") or {}
    leaked = [t["leaked_bytes"] for t in s.get("trials", []) if t["status"] == "oom"]
    out = [{"check": "search", "limit_gb": round(memory_limit_gb, 4),
            "oom_kind": [t.get("oom_kind") for t in s.get("trials", [])],
            **search_check(candidates, s.get("max_batch_size"), s.get("first_oom_batch_size"), predicted,
                           predicted_b0, leaked)}]
    b = s.get("max_batch_size")
    statuses = []
    if b:
        run = kvrun.run(compose(*[c for c in common if not c.startswith("task.n_samples")], f"task.n_samples={2 * b}",
                                 f"batch_size={b}", limit), lm=lm)
        statuses = [run["status"]]
    out.append({"check": "two_batches", "batch_size": b, **runs_check(statuses)})
    return out
