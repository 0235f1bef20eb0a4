"""search.max_batch=true: the largest batch size that fits the memory limit, found by real probes.

Doubling over the sorted candidates (the next candidate at least twice the last one that fit), then
bisection between the last candidate that fit and the first that did not; fitting is assumed
monotone in the batch size. Each trial is a real probe of the worst case: the b longest prompts of
the sample set (cycled when b exceeds it), the cache allocated for the full generation length, the
prefill and `search.decode_steps` decode steps, under the run's memory limit (`memory.limit_gb`: accounted
on CPU, the real cap on CUDA). On CPU, `search.probe=account` decides a trial from the accounted peak alone without
running it: the same verdict, minutes faster for long prompts. On CPU a real probe is decided by the
accounted limit too (the limit admits or refuses each batch from its accounted peak before it
allocates), so it costs the probe's time and adds no measurement; the result says what decided
(`decided_by`: "accounted" on CPU, "measured" under a CUDA cap) and how long it took.
Before every trial memory is released (gc, empty_cache) and its level taken; after an out-of-memory
trial the level is taken again *without* collecting (the engine frees a batch's cache by reference
counting when it returns or raises, so a cache only the collector could free is a leak) and must be
back where it was; a difference is logged and kept in the trial as `leaked_bytes`. The result is the
paper's pair: the largest batch that fits and the first
that does not (b0).
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from kvbench import engine, memory
from kvbench.attention import resolve_backend
from kvbench.budgets import head_rule
from kvbench.config.candidates import search_candidates
from kvbench.quant.qconfig import kv_quant

log = logging.getLogger("kvbench")


@dataclass
class Trial:
    batch_size: int
    status: str  # "ok" | "oom"
    peak_mem_bytes: int  # measured on CUDA (max_memory_allocated, all devices), accounted on CPU
    accounted_mem_bytes: int
    leaked_bytes: int = 0  # memory not given back after an oom trial (should stay 0)
    oom_kind: str | None = None  # an oom trial's kind: "accounted" (CPU memory limit) or "measured" (an allocator's)
    peak_reserved_bytes: int | None = None  # CUDA: max_memory_reserved, all devices (what the cap limits)


@dataclass
class SearchResult:
    max_batch_size: int | None  # None: not even the smallest candidate fits
    first_oom_batch_size: int | None  # None: every candidate up to the largest fits
    trials: list[Trial] = field(default_factory=list)
    decided_by: str | None = None  # "accounted" (CPU: the accounted limit, either probe) | "measured" (CUDA)
    probe: str | None = None  # search.probe
    wall_s: float | None = None  # the search's time

    def to_record(self) -> dict:
        return asdict(self)


def search(candidates: list[int], trial: Callable[[int], Trial]) -> SearchResult:
    """Doubling then bisection over sorted `candidates`; `trial(b)` probes batch size b."""
    trials: list[Trial] = []

    def fits(i: int) -> bool:
        trials.append(trial(candidates[i]))
        return trials[-1].status == "ok"

    lo, hi, i = -1, None, 0  # indices: the largest that fit, the smallest that did not
    while True:
        if not fits(i):
            hi = i
            break
        lo = i
        if i == len(candidates) - 1:
            break
        i = min(bisect.bisect_left(candidates, 2 * candidates[i], lo=i + 1), len(candidates) - 1)
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return SearchResult(
        max_batch_size=candidates[lo] if lo >= 0 else None,
        first_oom_batch_size=candidates[hi] if hi is not None else None,
        trials=trials,
    )


def probe_prompts(ids: list[list[int]], batch_size: int) -> list[list[int]]:
    """The worst case batch: the `batch_size` longest prompts, cycled when there are fewer."""
    longest = sorted(ids, key=len, reverse=True)
    return [longest[i % len(longest)] for i in range(batch_size)]


def probe(cfg, lm, policy, ids: list[list[int]], batch_size: int, memory_limit: memory.MemoryLimit | None) -> Trial:
    """One trial: prefill + `search.decode_steps` decode steps of the worst-case batch, under `memory_limit`
    (kvbench.memory.MemoryLimit: accounted on CPU, a cap on CUDA; None: no limit)."""
    prompts = probe_prompts(ids, batch_size)
    quant = kv_quant(cfg.gen)  # gen.kv_cache_dtype: the account charges and the engine builds the same cache
    acc = memory.account(
        dataclasses.replace(memory.ModelShape.of(lm.model, lm.kinds), kv_quant=quant), [len(x) for x in prompts], policy, max_new_tokens=cfg.gen.max_new_tokens,
        prefill_chunk=cfg.gen.prefill_chunk, score_chunk=cfg.gen.score_chunk,
        attention=resolve_backend(cfg.gen.attention, lm.model, policy.needs.attention,
                                  head_rule(policy).uneven or quant is not None, lm.kinds),
    )
    devices = memory.cuda_devices(lm.model)
    memory.release()  # a clean start: garbage from before the trial is not part of its level
    before = memory.memory_level(devices)
    memory.reset_peaks(devices)
    status, kind = "ok", None
    if cfg.search.probe == "account":
        try:
            if memory_limit is not None:
                memory_limit.admit(acc)
        except memory.MemoryLimitExceeded:
            status = "oom"
        return Trial(batch_size=batch_size, status=status, peak_mem_bytes=acc.total, accounted_mem_bytes=acc.total,
                     oom_kind="accounted" if status == "oom" else None)
    try:
        engine.generate(
            lm.model, lm.tokenizer, prompts, policy, batch_size,
            max_new_tokens=cfg.gen.max_new_tokens, eos_token_ids=lm.eos_token_ids, ignore_eos=True,
            prefill_chunk=cfg.gen.prefill_chunk, score_chunk=cfg.gen.score_chunk, memory_limit=memory_limit,
            decode_steps=cfg.search.decode_steps, attention=cfg.gen.attention, kinds=lm.kinds, kv_quant=quant,
        )
    except Exception as e:
        if not memory.is_oom(e):
            raise
        status, kind = "oom", memory.oom_kind(e)  # leaving this block drops the traceback (and its frames)
    peak = sum(memory.measured_peaks(devices).values()) if devices else acc.total
    trial = Trial(batch_size=batch_size, status=status, peak_mem_bytes=peak, accounted_mem_bytes=acc.total,
                  oom_kind=kind, peak_reserved_bytes=sum(memory.reserved_peaks(devices).values()) if devices else None)
    if status == "oom":
        trial.leaked_bytes = memory.memory_level(devices) - before
        if trial.leaked_bytes:
            log.warning("search: the oom trial at b=%d left %d bytes behind", batch_size, trial.leaked_bytes)
    log.info("search: b=%d %s (peak %.3f GiB)", batch_size, status, peak / memory.GiB)
    return trial


def max_batch(cfg, lm, policy, ids: list[list[int]], memory_limit: memory.MemoryLimit | None) -> SearchResult:
    """Search `search.candidates` (capped by `search.max` and the sample count) for the largest batch that fits."""
    start = time.perf_counter()
    result = search(search_candidates(cfg), lambda b: probe(cfg, lm, policy, ids, b, memory_limit))
    result.decided_by = "measured" if memory.cuda_devices(lm.model) else "accounted"
    result.probe, result.wall_s = cfg.search.probe, round(time.perf_counter() - start, 3)
    return result
