"""The RULER results table of docs/long-context.md, from results/ruler_cpu/runs.jsonl (scripts/ruler_cpu.sh).

    python scripts/ruler_table.py [RESULTS_DIR]     # writes RESULTS_DIR/table.md (default results/ruler_cpu)

One row per (task, context length, query-aware, method, schedule, compression ratio): the haystack (RULER's
for the task unless task.haystack says otherwise), the new tokens allowed, the mean RULER score
(string_match_all) with its 95% bootstrap interval, its paired difference to the full cache of the same task
and context length (same samples), tokens/s and the run's batch size. Prints one JSON line (rows written).
tests/project/test_long_context_results.py recomputes the committed table from the committed records.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvbench.report.grouping import latest  # noqa: E402
from kvbench.report.rows import METHODS, with_ci  # noqa: E402
from kvbench.results import read_records  # noqa: E402
from kvbench.stats import paired_diff  # noqa: E402

DEFAULT_HAYSTACK = "RULER's"  # the task's own (task.haystack null)
SCHEDULES = {"prefill_and_decode": "P&D", "decode_only": "D", "after_prefill": "AP"}
ORDER = ["full", "window", "streaming_llm", "h2o", "tova", "snapkv", "batch_max"]


def scores(rec: dict, base: Path) -> dict[int, float]:
    """Per-sample scores by dataset index, from the run's scores file (committed) or predictions."""
    for key in ("scores_path", "predictions_path"):
        path = rec.get(key)
        if not path:
            continue
        p = Path(path) if Path(path).is_absolute() else ROOT / path
        if p.is_file():
            rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
            return {r["index"]: r["score"]["string_match_all"] for r in rows}
    return {}


def table(results_dir: Path) -> tuple[str, int]:
    recs = [r for r in latest(read_records(results_dir)) if r.get("status") == "ok"
            and "string_match_all" in (r.get("metrics") or {})]
    length = {id(r): (r["task"], r["config"]["task"]["context_length"]) for r in recs}
    full = {length[id(r)]: r for r in recs if r["policy"] == "full" and r.get("query_aware", True)}

    def key(r):
        return (*length[id(r)], not r.get("query_aware", True), ORDER.index(r["policy"]) if r["policy"] in ORDER
                else 99, r["policy"], r.get("schedule") or "", r.get("compression_ratio") or 0)

    lines = ["| task, context | haystack, new tokens | method | setting | RULER score [95% CI] "
             "| vs full cache [95% CI] | tok/s | b |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(recs, key=key):
        n = length[id(r)]
        m = r["metrics"]
        diff = "-"
        if r["policy"] != "full" and n in full:
            d = paired_diff(scores(r, results_dir), scores(full[n], results_dir))
            diff = with_ci(d["mean"], d["ci"], sign="+") if d else "-"
        setting = [] if r["policy"] == "full" else [SCHEDULES.get(r.get("schedule"), "-")]
        setting += [f"{r['compression_ratio']:g}"] if r.get("compression_ratio") is not None else []
        setting += [] if r.get("query_aware", True) else ["query-agnostic"]
        lines.append("| " + " | ".join([
            f"`{n[0]}` {n[1]}", f"{r['config']['task'].get('haystack') or DEFAULT_HAYSTACK}, {r['max_new_tokens']}",
            METHODS.get(r["policy"], r["policy"]), " ".join(setting) or "-",
            with_ci(m["string_match_all"], m.get("string_match_all_ci")), diff,
            f"{r['throughput_tok_s']:.2f}", str(r["batch_size"])]) + " |")
    return "\n".join(lines) + "\n", len(recs)


def main() -> None:
    results_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "results" / "ruler_cpu")
    text, n = table(results_dir)
    (results_dir / "table.md").write_text(text)
    print(json.dumps({"table": str(results_dir / "table.md"), "rows": n}))


if __name__ == "__main__":
    main()
