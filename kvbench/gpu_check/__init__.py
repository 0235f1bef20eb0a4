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
  search        a real-OOM search (`search.max_batch=true` under `memory.limit_gb`, CUDA's own cap): the
                searched largest batch and b0 next to the accounted prediction (within one candidate),
                and after each out-of-memory trial memory back at its level (`leaked_bytes` 0).
  two_batches   two full batches in a row at the searched largest batch, under the same cap, no OOM
                (a finished batch's cache is freed before the next one allocates).
  device_map    (>= 2 GPUs) the layers split over the GPUs give the same tokens as one GPU, with a peak
                per device in the run record.

Modules: `checks` (the verdicts: pure functions of measured numbers, tested on CPU in tests/gpu_check/test_checks.py),
`fixtures` (the model, prompts, configs and the `model.generate` reference), `tokens` (parity, serve, offload,
device map), `resources` (memory, syncs, the search; its glue is run on a tiny CPU model with the default
arguments by the tests), `cli` (arguments, the order of the checks, the exit code). The CUDA-only glue has
not run on a GPU (no GPU was lent to this work; the contracts it relies on are tested on CPU in
tests/attention/test_gpu_contracts.py).

    kvbench-gpu-check [--budget-batch 24] [--prompt-tokens 1024] [--new-tokens 32]
"""

from __future__ import annotations

from kvbench.gpu_check.gpu_cli import entry, main, parse, steps
from kvbench.gpu_check.resources import (
    GPU,
    check_memory,
    check_search_and_two_batches,
    check_syncs,
    count_syncs,
)
from kvbench.gpu_check.tokens import check_device_map, check_offload, check_parity, check_serve, parity_cases
from kvbench.gpu_check.verdicts import (
    MEMORY_TOL,
    POLICIES,
    RESERVED_TOL,
    SEARCH_MAX,
    SKIPPED,
    TIE_MARGIN,
    TRANSIENT_SLACK,
    available_backends,
    backend_runs,
    compare_tokens,
    device_map_check,
    exit_code,
    line,
    memory_ratio,
    predicted_search,
    runs_check,
    search_check,
    search_samples,
    split_device_map,
    summary,
    syncs_check,
    transient_check,
)

__all__ = [
    "GPU", "MEMORY_TOL", "POLICIES", "RESERVED_TOL", "SEARCH_MAX", "SKIPPED", "TIE_MARGIN", "TRANSIENT_SLACK",
    "available_backends", "backend_runs", "check_device_map", "check_memory", "check_offload", "check_parity",
    "check_search_and_two_batches", "check_serve", "check_syncs", "compare_tokens", "count_syncs",
    "device_map_check", "entry", "exit_code", "line", "main", "memory_ratio", "parity_cases", "parse",
    "predicted_search", "runs_check", "search_check", "search_samples", "split_device_map", "steps", "summary",
    "syncs_check", "transient_check",
]
