"""The GPU acceptance's verdicts: pure functions of measured numbers (tokens, bytes, sync counts, statuses).

Each returns a dict with "ok" and the figures it judged, which the glue (`kvbench.gpu_check.tokens`,
`kvbench.gpu_check.resources`) prints as one JSON line. Nothing here touches a GPU, so every verdict is
tested on CPU with made-up figures (tests/gpu_check/test_checks.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

SKIPPED = 77  # the conventional "test skipped" exit code (automake, meson)
TIE_MARGIN = {"float16": 0.05, "bfloat16": 0.1, "float32": 1e-3}  # logit gap under which greedy may flip
MEMORY_TOL = 0.10
TRANSIENT_SLACK = 32 * 2**20  # bytes the account does not model: cuBLAS's workspace, the allocator's rounding
RESERVED_TOL = 0.5  # the reserved transient may exceed the accounted one by this share (the allocator's cache)
POLICIES = ("full", "window", "extreme_decode", "batch_max", "h2o", "knorm", "pyramidkv")
SEARCH_MAX = 240  # the search's largest candidate


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


def search_samples(budget_batch: int) -> int:
    """The sample count for the search check: the search's candidates (divisors of 960 up to SEARCH_MAX) are
    capped at the sample count, and the search doubles past `budget_batch` (the batch whose accounted peak sets
    the memory limit) before it bisects, so every candidate up to twice the one after it must stay.
    ValueError: not a divisor of 960 below SEARCH_MAX (the limit is set between its accounted peak and the next
    candidate's)."""
    from kvbench.config import DIVISORS_OF_960

    cands = [c for c in DIVISORS_OF_960 if c <= SEARCH_MAX]
    if budget_batch not in cands[:-1]:
        raise ValueError(f"--budget-batch must be a divisor of 960 below {SEARCH_MAX}: {budget_batch}")
    nxt = cands[cands.index(budget_batch) + 1]
    return next((c for c in cands if c >= 2 * nxt), SEARCH_MAX)


def runs_check(statuses: Sequence[str]) -> dict:
    """ok: at least one run, and every run's record has status "ok"."""
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
