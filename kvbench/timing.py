"""Section timers that stay honest on a GPU without synchronising per call: time in eviction, in statistics.

`SectionTimer()(name, devices)` brackets a block. On CUDA it records a pair of CUDA events on each
device's current stream (asynchronous: no synchronisation, so the timed code runs as fast as untimed)
and `totals()` reads their elapsed times once, after the batch's final synchronisation; a section that
spans several GPUs counts the longest of its devices. On CPU every op is synchronous, so wall time
inside the block (`time.perf_counter`) is its cost. The engine uses it for `evict_s` (evictions and
the decode_only resize) and `attn_stats_s` (recomputing attention weights and adding them to the
running sums, for the policies that score with them).
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence

import torch


class SectionTimer:
    def __init__(self):
        self._cpu: dict[str, float] = defaultdict(float)
        self._events: dict[str, list[list[tuple]]] = defaultdict(list)  # name -> per call: [(start, end)] per GPU

    @contextlib.contextmanager
    def __call__(self, name: str, devices: Sequence[torch.device]) -> Iterator[None]:
        gpus = [d for d in devices if d.type == "cuda"]
        if not gpus:
            t = time.perf_counter()
            try:
                yield
            finally:
                self._cpu[name] += time.perf_counter() - t
            return
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in gpus]
        for d, (start, _) in zip(gpus, pairs, strict=True):
            start.record(torch.cuda.current_stream(d))
        try:
            yield
        finally:
            for d, (_, end) in zip(gpus, pairs, strict=True):
                end.record(torch.cuda.current_stream(d))
            self._events[name].append(pairs)

    def totals(self) -> dict[str, float]:
        """Seconds per section name (waits for the recorded CUDA events; call after the work is issued)."""
        out = dict(self._cpu)
        for name, calls in self._events.items():
            total = 0.0
            for pairs in calls:
                for _, end in pairs:
                    end.synchronize()
                total += max(start.elapsed_time(end) for start, end in pairs) / 1000.0
            out[name] = out.get(name, 0.0) + total
        return out
