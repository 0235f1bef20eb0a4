"""`kvbench-needle`: a needle-in-a-haystack sweep, depth x context length for chosen policies, and its heatmaps.

    kvbench-needle --lengths 1024,2048 --depths 0,0.25,0.5,0.75,1 \\
        --policy full --policy "h2o policy.compression_ratio=0.5" [kvbench overrides ...]

Each (policy, length, depth) is one ordinary kvbench run (`task.context_length`, `task.depth`; default task
RULER's niah_single_1) appended to `results_dir/runs.jsonl` (skip_existing=true: a sweep cut short resumes);
then `kvbench-report` writes the heatmaps (`plots/needle_*.png`, one per policy and `needle_grid.png`)
and tables.md. A `--policy` value is a policy config name, optionally followed by overrides for it alone.
Every job is composed and validated first: a bad one stops the command with one line, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from kvbench.arguments import Parser
from kvbench.cli import checked


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The flags and the kvbench overrides; `args.policy`: each `--policy` split into its name and overrides."""
    p = Parser(prog="kvbench-needle", description=__doc__.split("\n")[0])
    p.add_argument("--lengths", default="1024,2048,4096", help="context lengths in tokens (comma-separated)")
    p.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="needle depths, shares of the context")
    p.add_argument("--policy", action="append", help="a policy config name and its overrides (repeatable; "
                   "default: full)")
    p.add_argument("--task", default="niah_single_1", help="a RULER needle task (default niah_single_1)")
    args, overrides = p.parse_known_args(argv)
    try:
        args.lengths = [int(x) for x in args.lengths.split(",") if x]
        args.depths = [float(x) for x in args.depths.split(",") if x]
    except ValueError:
        p.error("--lengths takes integers and --depths numbers, comma-separated")
    if not args.lengths or not args.depths or any(not 0 <= d <= 1 for d in args.depths):
        p.error("--lengths and --depths must be non-empty, depths in [0, 1]")
    args.policy = [policy_spec(p, spec) for spec in args.policy or ["full"]]
    bad = [o for o in overrides if o.startswith("-")]
    if bad:
        p.error(f"unknown option {bad[0]}")
    return args, overrides


def policy_spec(p: Parser, spec: str) -> list[str]:
    """One `--policy` value as [name, *overrides] (shell-like quoting), or one line and exit code 2."""
    try:
        words = shlex.split(spec)
    except ValueError as e:  # e.g. an unclosed quote
        p.error(f"--policy {spec!r}: {e}")
    if not words or "=" in words[0]:
        p.error(f"--policy {spec!r}: takes a policy config name, then overrides for it alone (e.g. \"h2o "
                "policy.kv_size=256\")")
    return words


def jobs(args: argparse.Namespace, overrides: list[str]) -> list[list[str]]:
    """Every run's overrides: the common ones, the task's length and depth, the policy's."""
    base = [f"task={args.task}", *overrides]
    if not any(o.split("=", 1)[0] == "skip_existing" for o in base):
        base.append("skip_existing=true")
    out = []
    for name, *extra in args.policy:
        for n in args.lengths:
            for d in args.depths:
                out.append([*base, f"policy={name}", *extra, f"task.context_length={n}", f"task.depth={d}"])
    return out


def main(argv: list[str] | None = None) -> None:
    from hydra import compose, initialize_config_dir

    from kvbench.cli import preflight
    from kvbench.config import CONF_DIR

    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("KVBENCH_LAUNCHER_PID", str(os.getpid()))
    args, overrides = parse(argv)
    todo = jobs(args, overrides)
    for job in todo:
        checked(preflight, job, "kvbench-needle")
    from kvbench.report import write_report
    from kvbench.run import run

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="needle"):
        results_dir = None
        for job in todo:
            cfg = compose("config", overrides=job)
            results_dir = cfg.results_dir
            rec = run(cfg)
            print(f"kvbench-needle: {' '.join(job[-3:])} -> {rec['status']}, metrics={json.dumps(rec.get('metrics'))}",
                  flush=True)
    written = write_report(results_dir)
    print(json.dumps({"needle": sorted(str(v) for k, v in written.items() if k.startswith("needle"))}))


if __name__ == "__main__":
    main()
