"""The `kvbench-plan` command: compose and check every job up front, make each plan, print it as a table.

Bad input is one line and exit code 2 before anything is built (`preflight`, through kvbench.cli's
`checked`), or, for what only the plan finds (weights that do not fit the node, a tokenizer offline),
one `kvbench-plan: error:` line and exit code 2. A plan prints its table, then one JSON summary line.
"""

from __future__ import annotations

import json
import sys

from kvbench import memory
from kvbench.capacity.node import check
from kvbench.capacity.planner import plan
from kvbench.config import CONF_DIR, prepare
from kvbench.errors import ConfigError


def table(record: dict) -> str:
    """The plan as a text table (one line per backend and policy)."""
    p = record["plan"]
    layers = " / ".join(f"{d} {n}" for d, n in sorted(p["model"]["layers"].items()))
    weights = " / ".join(f"{w / memory.GiB:.2f}" for _, w in sorted(p["model"]["weights_bytes"].items()))
    kv, plain = p["model"]["kv_bytes_one_sample"], p["model"]["kv_bytes_one_sample_without_windows"]
    kinds = p["model"].get("kv_per_token", [])  # the K/V bytes per token of each layer kind
    lines = [
        f"kvbench-plan: {record['model']} ({p['model']['dtype']}, {p['model']['parameters'] / 1e9:.2f}B parameters)"
        f" on {record['device']}, reserve {p['node']['reserve_gb']:g} GiB per device",
        f"  layers {layers}; weights {weights} GiB; {p['model']['attention_kinds']}",
        f"  full KV cache of one longest sample: {kv / 2**20:.1f} MiB"
        + (f" ({plain / 2**20:.1f} MiB if no layer had a window)" if plain != kv else "")
        + (f"; linear-attention state {state / 2**20:.2f} MiB per sequence, apart from the KV"
           if (state := p["model"].get("state_bytes_per_sequence")) else ""),
        *(["  KV per token per layer: " + ", ".join(  # where layers differ in KV heads or head size (Gemma 4)
            f"{k['layers']} {'full' if k['window'] is None else 'windowed'} layers {k['kv_heads']} x {k['head_dim']}: "
            f"{k['bytes']:,} B" for k in kinds)] if len({k["bytes"] for k in kinds}) > 1 else []),
        f"  {record['task']}: prompts {p['prompts']['tokens_min']}-{p['prompts']['tokens_max']} tokens"
        f" ({p['prompts']['source']}), {record['max_new_tokens']} new tokens; batch sizes from {len(p['candidates'])}"
        " candidates",
        "",
        f"{'attention':<10}{'method':<8}{'kv':>6}{'b':>6}{'b0':>6}  peak at b (fullest device)",
    ]
    for r in p["rows"]:
        peak = "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / memory.GiB:.2f} GiB"
        lines.append(f"{r['attention']:<10}{r['method']:<8}{r['kv_size'] or '-':>6}{r['max_batch_size'] or '-':>6}"
                     f"{r['first_oom_batch_size'] or '-':>6}  {peak}")
    return "\n".join(lines)


def preflight(argv: list[str]) -> None:
    """Compose and check every job of the command line (no model, no tokenizer)."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from kvbench.cli import HELP_FLAGS, split_argv
    from kvbench.config.validate import refuse_renamed

    overrides, multirun, config_name, runs = split_argv(argv)
    if any(a in HELP_FLAGS for a in argv):
        return
    refuse_renamed(overrides)
    parsed = OverridesParser.create().parse_overrides(overrides)
    jobs = [j for batch in BasicSweeper.split_arguments(parsed, None) for j in batch] if multirun else [overrides]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="kvbench-plan"):
        for job in jobs:
            cfg = compose(config_name=config_name, overrides=list(job))
            if runs:
                prepare(cfg)
                check(cfg)


def main(argv: list[str] | None = None) -> None:
    from kvbench.cli import checked

    argv = list(sys.argv[1:] if argv is None else argv)
    checked(preflight, argv, "kvbench-plan")
    import hydra

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
    def app(cfg) -> None:
        try:
            record = plan(cfg)
        except ConfigError as e:
            print(f"kvbench-plan: error: {e}", file=sys.stderr)
            sys.exit(2)
        print(table(record), flush=True)
        summary = [{k: r[k] for k in ("attention", "method", "kv_size", "max_batch_size", "first_oom_batch_size")}
                   for r in record["plan"]["rows"]]
        print("kvbench-plan:", json.dumps({"run_id": record["run_id"], "rows": summary}), flush=True)

    sys.argv = [sys.argv[0], *argv]
    app()
