"""Memory: the accounted peak of a batch, the memory limit it is admitted under, the CUDA cap, measurements.

`memory.limit_gb` (GiB, 2**30 bytes, per device) is a real cap on CUDA
(`torch.cuda.set_per_process_memory_fraction`: an out-of-memory is the allocator's own) and an
*accounted* limit on CPU: before a batch runs, `account` computes its peak and a batch over the limit
raises `MemoryLimitExceeded` (an `OutOfMemory`: the run is an "oom") before anything is allocated. On
CUDA the same figure is recorded next to `torch.cuda.max_memory_allocated`, so the model can be
checked against reality.

Modules, pure arithmetic first, side effects last (imports go down this list, never up):

* `shape`: `ModelShape`, the numbers of a loaded model the account needs (the only model introspection).
* `terms`: transient bytes of one forward, one eviction, one window trim; a cache's bytes.
* `accounting`: `account` (with `policy_weights`, a policy's own weights), the batch's plan (kvbench.batch_plan, what the engine executes) folded, the largest term per device (its
  docstring has the formulas); `Account`, `Footprint`.
* `limit`: `MemoryLimit` (memory.limit_gb less memory.reserve_gb) and admission (`MemoryLimitExceeded`,
  `ModelDoesNotFit`).
* `cap`: `apply_cuda_cap`, the limit made real on every GPU.
* `oom`: what counts as an out-of-memory and whether it was accounted or measured.
* `measure`: CUDA's peaks, the memory level a trial must return to, `release`.

Every name is re-exported here, so `kvbench.memory.<name>` keeps working; to replace one in a test, patch the
module that defines it unless its caller looks it up here (e.g. the engine calls `kvbench.memory.account`).
"""

from __future__ import annotations

from kvbench.memory.accounting import Account, Footprint, GiB, account, fold, policy_weights
from kvbench.memory.cap import apply_cuda_cap
from kvbench.memory.limit import MemoryLimit, MemoryLimitExceeded, ModelDoesNotFit, memory_limit_of
from kvbench.memory.measure import (
    cuda_devices,
    measured_peaks,
    memory_level,
    release,
    reserved_peaks,
    reset_peaks,
)
from kvbench.memory.oom import OOM_KINDS, OOM_MESSAGES, is_oom, oom_kind
from kvbench.memory.shape import ModelShape
from kvbench.memory.terms import (
    EVICT_BYTES,
    GATHER_LAYERS,
    HIDDEN_BUFFERS,
    ID_BUFFERS,
    ROPE_BUFFERS,
    ROTATE_ACC,
    cache_bytes,
    cpu_sdpa_workspace,
    evict_bytes,
    forward_bytes,
    trim_bytes,
)

__all__ = [
    "EVICT_BYTES", "GATHER_LAYERS", "HIDDEN_BUFFERS", "ID_BUFFERS", "OOM_KINDS", "OOM_MESSAGES", "ROPE_BUFFERS",
    "ROTATE_ACC", "Account", "Footprint", "GiB", "MemoryLimit", "MemoryLimitExceeded",
    "ModelDoesNotFit", "ModelShape", "account", "apply_cuda_cap", "cache_bytes", "cpu_sdpa_workspace",
    "cuda_devices", "evict_bytes", "fold", "forward_bytes", "policy_weights", "is_oom", "measured_peaks", "memory_level", "memory_limit_of",
    "oom_kind", "release", "reserved_peaks", "reset_peaks", "trim_bytes",
]
