"""What `kvbench-report` writes: tables.md (with the plots), runs.csv."""

from __future__ import annotations

import csv
import logging
from pathlib import Path

from kvbench.config import ReproduceConfig
from kvbench.report import heatmap
from kvbench.report.grouping import unusable
from kvbench.report.plots import plot_table
from kvbench.report.rows import PLOTS
from kvbench.report.tables import tables
from kvbench.results import read_records

CSV_FIELDS = (
    "run_id", "config_hash", "started_at", "status", "experiment", "model", "task", "policy", "kv_size",
    "evict_every", "schedule", "batch_size", "n_samples", "max_new_tokens", "seed", "device",
    "throughput_tok_s", "prefill_s", "decode_s", "wall_s", "generated_tokens", "peak_kv_bytes", "peak_mem_bytes",
)
log = logging.getLogger("kvbench")


def write_csv(records: list[dict], path: Path) -> None:
    metric_keys = sorted({k for r in records if isinstance(r.get("metrics"), dict) for k in r["metrics"]})
    fields = [*CSV_FIELDS, *(f"metric_{k}" for k in metric_keys), "search_max_batch_size",
              "search_first_oom_batch_size", "error", "predictions_path", *EXTRA_CSV]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in records:
            search = r.get("search") if isinstance(r.get("search"), dict) else {}
            metrics = r.get("metrics") if isinstance(r.get("metrics"), dict) else {}
            w.writerow({
                **{k: r.get(k) for k in (*CSV_FIELDS, "error", "predictions_path")},
                **{f"metric_{k}": v for k, v in metrics.items()},
                "search_max_batch_size": search.get("max_batch_size"),
                "search_first_oom_batch_size": search.get("first_oom_batch_size"),
                **extra_csv(r),
            })


EXTRA_CSV = ("weights", "output_tokens_mean", "output_tokens_median", "output_tokens_max", "scores_path")


def extra_csv(r: dict) -> dict:
    lengths = r.get("output_tokens") or {}
    return {"weights": r.get("weights"), "scores_path": r.get("scores_path"),
            **{f"output_tokens_{k}": lengths.get(k) for k in ("mean", "median", "max")}}


def write_report(results_dir: str | Path, out: str | Path | None = None, near_fkv: float | None = None,
                 plots: bool = True) -> dict[str, Path]:
    """Write tables.md, runs.csv and the plots; returns what was written (name -> path)."""
    records = read_records(results_dir)
    out = Path(out or results_dir)
    out.mkdir(parents=True, exist_ok=True)
    near = ReproduceConfig.near_fkv if near_fkv is None else near_fkv
    ts = tables(records, near, results_dir)
    n_err = sum(1 for r in records if r.get("status") == "error")
    n_int = sum(1 for r in records if r.get("status") == "interrupted")
    bad = [(r.get("run_id"), why) for r in records if (why := unusable(r))]
    if bad:
        log.warning("kvbench-report: %d record(s) left out of the tables: %s", len(bad),
                    "; ".join(f"{i}: {why}" for i, why in bad[:10]))
    parts = [
        "# kvbench results",
        "",
        f"{len(records)} records in runs.jsonl"
        + (f" ({n_err} ended with an error: not in the tables, see runs.csv)" if n_err else "")
        + (f" ({n_int} interrupted: not in the tables)" if n_int else "")
        + (f" ({len(bad)} the report cannot use: {', '.join(sorted({w for _, w in bad}))})" if bad else "")
        + ". ED: extreme decoding-only eviction, FKV: full cache, BM: Batch-Max; tokens/s: generated"
        " tokens per second, prefill included.",
        "",
    ]
    written = {}
    for t in ts:
        kinds = plot_table(t, out / "plots") if plots else []
        written.update({f"{t.slug}_{k}": out / "plots" / f"{t.slug}_{PLOTS[k][0]}" for k in kinds})
        parts.append(t.markdown(kinds))
    needle = heatmap.write(records, out / "plots") if plots else {}  # depth-swept runs (kvbench-needle)
    written.update(needle)
    parts.append(heatmap.markdown(records, needle))
    (out / "tables.md").write_text("\n".join(parts).rstrip("\n") + "\n")
    write_csv(records, out / "runs.csv")
    written.update({"tables.md": out / "tables.md", "runs.csv": out / "runs.csv"})
    return written
