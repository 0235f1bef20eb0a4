"""The CUDA cap: a run's memory limit made real on every visible GPU (a side effect on the process).

`torch.cuda.set_per_process_memory_fraction` makes an allocation beyond the limit fail in the allocator
itself, so on CUDA an out-of-memory is measured, never accounted. The cap is per process and outlives a
run: every run sets its own as it loads its model (`kvbench.run.models.load_within`; no limit lifts it), and
kvbench-gpu-check lifts it after its capped search (`apply_cuda_cap(None)`).
"""

from __future__ import annotations

import torch

from kvbench.memory.limit import MemoryLimit


def apply_cuda_cap(memory_limit: MemoryLimit | None) -> None:
    """Cap every visible GPU at the memory limit less the reserve (fraction of its memory), or lift the cap.

    The reserve emulates what a smaller card loses outside PyTorch's allocator (its CUDA context)."""
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        total = torch.cuda.get_device_properties(i).total_memory
        fraction = 1.0 if memory_limit is None else min(1.0, memory_limit.usable / total)
        torch.cuda.set_per_process_memory_fraction(fraction, i)
