"""The `kvbench-report RESULTS_DIR` command: bad input is one line and exit code 2 (kvbench.arguments)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvbench.arguments import Parser
from kvbench.config import ReproduceConfig
from kvbench.report.files import write_report
from kvbench.results import probe_writable


def main(argv: list[str] | None = None) -> None:
    p = Parser(prog="kvbench-report", description="Tables, a CSV and plots from RESULTS_DIR/runs.jsonl.")
    p.add_argument("results_dir", help="a results directory holding runs.jsonl")
    p.add_argument("--out", help="where to write (default: RESULTS_DIR)")
    p.add_argument("--near-fkv", type=float, default=None,
                   help=f"the near-FKV pick's share of FKV's metric (default {ReproduceConfig.near_fkv})")
    p.add_argument("--no-plots", action="store_true", help="tables and CSV only")
    args = p.parse_args(argv)
    if not (Path(args.results_dir) / "runs.jsonl").is_file():
        p.error(f"{args.results_dir} has no runs.jsonl")
    if args.near_fkv is not None and not 0 < args.near_fkv <= 1:
        p.error(f"--near-fkv {args.near_fkv:g}: must be a share of FKV's metric in (0, 1]")
    out = Path(args.out or args.results_dir)
    try:
        probe_writable(out)  # before any file: never a report half written
        written = write_report(args.results_dir, args.out, args.near_fkv, plots=not args.no_plots)
    except OSError as e:
        print(f"kvbench-report: error: cannot write into {out}: {e.strerror or e}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps({k: str(v) for k, v in written.items()}, indent=1))
