"""What counts as an out-of-memory, and how it was decided: "accounted" (final) or "measured" (may be transient).

A real out-of-memory surfaces as many exception types (PyTorch's allocator, cuBLAS / cuDNN / cuSOLVER /
cuFFT allocating their own workspaces, the CPU allocator); kvbench's accounted one is an `OutOfMemory` of
kind "accounted". The runner and the batch-size search record both as status "oom" with their `oom_kind`;
a sweep's `skip_existing` (kvbench.results) retries a measured one once and keeps an accounted one as final.
"""

from __future__ import annotations

import torch

from kvbench.errors import OutOfMemory

OOM_MESSAGES = (  # lower case; what a library says when an allocation inside it failed
    "out of memory",  # PyTorch's caching allocator, "CUDA error: out of memory"
    "can't allocate memory",  # the CPU allocator
    "cublas_status_alloc_failed",  # cuBLAS's workspace or handle (e.g. the first matmul of a new shape)
    "cudnn_status_alloc_failed",
    "cusolver_status_alloc_failed",
    "cufft_alloc_failed",
    "cudaerrormemoryallocation",
)
OOM_KINDS = ("accounted", "measured")


def is_oom(e: BaseException) -> bool:
    """A real or accounted out-of-memory (CUDA allocator, CUDA libraries' own allocations, CPU allocator,
    kvbench's account)."""
    text = str(e).lower()
    return isinstance(e, (OutOfMemory, torch.cuda.OutOfMemoryError)) or any(m in text for m in OOM_MESSAGES)


def oom_kind(e: BaseException) -> str:
    """How an out-of-memory was decided: "accounted" (the CPU memory limit's account: deterministic, final)
    or "measured" (an allocator, CUDA's or the CPU's, really ran out: may be transient)."""
    kind = getattr(e, "kind", None)
    return kind if kind in OOM_KINDS else "measured"
