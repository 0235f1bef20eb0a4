"""`kvbench-gpu-check`'s command line: parse the arguments, run every check in order, one JSON line each.

Without CUDA it prints one line and exits 77 (skipped). A check that raises is a failed line, never the end
of the run; the summary line follows, and the exit code is 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence

from kvbench.arguments import Parser
from kvbench.gpu_check.resources import check_memory, check_search_and_two_batches, check_syncs
from kvbench.gpu_check.tokens import check_device_map, check_offload, check_parity, check_serve
from kvbench.gpu_check.verdicts import SKIPPED, exit_code, line, search_samples, summary

DESCRIPTION = ("`kvbench-gpu-check` (`make gpu-check`): the one-command acceptance of kvbench's GPU path, on a machine "
               "with >= 1 CUDA GPU.")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = Parser(prog="kvbench-gpu-check", description=DESCRIPTION)
    ap.add_argument("--budget-batch", type=int, default=24, help="a divisor of 960 below 240: the search's memory "
                    "limit is set between its accounted peak and the next candidate's")
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    for flag in ("prompt_tokens", "new_tokens"):
        if getattr(args, flag) <= 0:
            ap.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be a positive integer")
    try:
        search_samples(args.budget_batch)
    except ValueError as e:
        ap.error(str(e))  # one line, exit 2
    return args


def steps(n_gpus: int) -> list[tuple[str, Callable]]:
    """The checks to run on a machine with `n_gpus` GPUs, in order: (name, function of (args, tmp)).

    The check functions are looked up in this module when called, so a test can replace them here."""
    out = [("parity", lambda a, t: check_parity(a)), ("memory", lambda a, t: check_memory(a)),
           ("syncs", lambda a, t: check_syncs(a)), ("serve", lambda a, t: check_serve(a)),
           ("offload", lambda a, t: check_offload(a)), ("search", lambda a, t: check_search_and_two_batches(a, t))]
    if n_gpus >= 2:
        out.append(("device_map", lambda a, t: check_device_map(a, t)))
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
