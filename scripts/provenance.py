"""What made a benchmark's JSON line: the command, the commit, the time and the machine's load.

Every figure in the docs is recomputed from a committed record (`tests/project/test_docs_figures.py`), so
each benchmark under `scripts/` appends its line, with these fields, to a file under `results/` by
default (`--out`; `--out ''` only prints it). On a shared machine the load average is the one
number that says how far a timing can be trusted, so it is taken before and after the run.

    from provenance import Provenance
    prov = Provenance()            # at the start: load average before, start time
    ...
    prov.emit(result, args.out)    # prints one JSON line, appends it to args.out
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def command(argv: list[str] | None = None) -> str:
    """The command line as typed from the repository root (`python scripts/x.py --flag ...`)."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve()
    try:
        argv[0] = str(script.relative_to(ROOT))
    except ValueError:
        pass
    return "python " + " ".join(shlex.quote(a) for a in argv)


class Provenance:
    def __init__(self, argv: list[str] | None = None):
        self.command = command(argv)
        self.started = datetime.now(timezone.utc)
        self.t0 = time.perf_counter()
        self.load_before = round(os.getloadavg()[0], 2)
        status = git("status", "--porcelain", "--untracked-files=no")
        self.commit = git("rev-parse", "HEAD")  # the code that runs: taken at the start
        self.dirty = bool(status) if status is not None else None  # uncommitted changes to tracked files

    def fields(self) -> dict:
        return {
            "command": self.command,
            "commit": self.commit,
            "dirty": self.dirty,
            "started_at": self.started.isoformat(timespec="seconds"),
            "wall_s": round(time.perf_counter() - self.t0, 1),
            "load_avg_1m_before": self.load_before,
            "load_avg_1m_after": round(os.getloadavg()[0], 2),
            "cpus": os.cpu_count(),
        }

    def emit(self, result: dict, out: str | os.PathLike | None) -> str:
        """Print `result` and its provenance as one JSON line; append it to `out` unless empty."""
        line = json.dumps({**result, "provenance": self.fields()})
        print(line, flush=True)
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            with open(out, "a") as f:
                f.write(line + "\n")
        return line
