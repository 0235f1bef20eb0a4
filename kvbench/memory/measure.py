"""Measurement: the allocator's peaks, memory given back, and garbage freed (side effects, CUDA or the CPU).

The account (`kvbench.memory.accounting`) predicts; these read what really happened: CUDA's allocated and
reserved peaks per device since a reset (recorded next to the account), the level a finished trial must
return to (the batch-size search records what an out-of-memory trial did not give back, `leaked_bytes`), and
`release`, which collects garbage before a trial's starting level is taken and after a run, never before the
level is checked (a leak must show).
"""

from __future__ import annotations

import gc

import torch

from kvbench.cache import KVCache


def cuda_devices(model) -> list[torch.device]:
    """The CUDA devices the model's parameters are on, sorted (empty on a CPU model)."""
    return sorted({p.device for p in model.parameters() if p.device.type == "cuda"}, key=str)


def reset_peaks(devices: list[torch.device]) -> None:
    for d in devices:
        torch.cuda.reset_peak_memory_stats(d)


def measured_peaks(devices: list[torch.device]) -> dict[str, int]:
    """torch.cuda.max_memory_allocated per device since the last `reset_peaks`."""
    return {str(d): torch.cuda.max_memory_allocated(d) for d in devices}


def reserved_peaks(devices: list[torch.device]) -> dict[str, int]:
    """torch.cuda.max_memory_reserved per device since the last `reset_peaks`: what the allocator held from
    CUDA (allocated + its cache and fragmentation), the figure the CUDA cap (`apply_cuda_cap`) limits."""
    return {str(d): torch.cuda.max_memory_reserved(d) for d in devices}


def release() -> None:
    """Free what no longer has a reference: Python cycles (gc), then the CUDA allocator's cache.

    kvbench itself leaves no cycle behind (a batch's cache is freed by reference counting when the batch
    ends); this is for the start of a trial or a run, so that its level does not include others' garbage.
    """
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def memory_level(devices: list[torch.device]) -> int:
    """Bytes a finished trial must have given back: allocated CUDA memory, or on CPU the live KV caches.

    On CPU the accounted memory limit refuses a batch before its cache exists, so the caches (the only
    large allocation that outlives a forward) are what an interrupted trial could leave behind; they are
    found through `KVCache.live()`, a weak registry. No `gc.collect()` here: a cache that only the
    cyclic collector could free is a leak, and must show.
    """
    if devices:
        return sum(torch.cuda.memory_allocated(d) for d in devices)
    return sum(c.allocated_bytes() for c in KVCache.live())
