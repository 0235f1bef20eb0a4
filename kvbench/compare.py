"""Per-sample comparison of a run with the full cache's, for kvbench-report: paired differences,
agreement of the generated tokens, output lengths.

A run's per-sample data comes from its predictions file (scores, generated ids, output lengths) or,
when that is gone, from its small scores file (`scores/<run_id>.jsonl`: index, score, output length;
committed with the records), which is enough for every interval but not for token agreement. Paths
are tried as recorded, then under the results directory being reported (records keep the path the
run was started with, which may be relative to another working directory).
The statistics themselves are kvbench.stats.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvbench import stats


@dataclass
class Samples:
    """One run's per-sample data, keyed by dataset index."""

    scores: dict[int, dict[str, float]]
    token_ids: dict[int, list[int]] | None  # None: only the scores file was found
    lengths: dict[int, int]

    def metric(self, key: str) -> dict[int, float]:
        return {i: s[key] for i, s in self.scores.items() if key in s}


def _read(path: Path) -> list[dict] | None:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError):
        return None


def _candidates(rec: dict, results_dir: Path, kind: str) -> list[Path]:
    recorded = rec.get(f"{kind}_path")
    out = [Path(recorded)] if recorded else []
    return [*out, results_dir / kind / f"{rec.get('run_id')}.jsonl"]


def load(rec: dict, results_dir: str | Path, cache: dict | None = None) -> Samples | None:
    """The run's per-sample data from its predictions file, else its scores file; None if neither is there."""
    key = rec.get("run_id")
    if cache is not None and key in cache:
        return cache[key]
    results_dir = Path(results_dir)
    found = None
    for kind in ("predictions", "scores"):
        for path in _candidates(rec, results_dir, kind):
            rows = _read(path) if path.is_file() else None
            if rows and all("index" in r and "score" in r for r in rows):
                found = Samples(
                    scores={r["index"]: r["score"] for r in rows},
                    token_ids={r["index"]: r["token_ids"] for r in rows} if kind == "predictions" else None,
                    lengths={r["index"]: r["output_tokens"] for r in rows if r.get("output_tokens") is not None},
                )
                break
        if found:
            break
    if cache is not None:
        cache[key] = found
    return found


def metric_ci(rec: dict, metric: str, samples: Samples | None) -> tuple[float, float] | None:
    """The record's `<metric>_ci`, else rebuilt from the per-sample scores (older records, scores files)."""
    ci = (rec.get("metrics") or {}).get(f"{metric}_ci")
    if ci is not None:
        return tuple(ci)
    if samples is None:
        return None
    return stats.bootstrap_ci([v for _, v in sorted(samples.metric(metric).items())])


def lengths(rec: dict, samples: Samples | None) -> dict | None:
    """Output-length summary: the record's, else from the per-sample lengths."""
    if rec.get("output_tokens"):
        return rec["output_tokens"]
    return stats.length_summary(list(samples.lengths.values())) if samples and samples.lengths else None


@dataclass
class VsFKV:
    """A run against the FKV run of its table, on the samples both scored."""

    diff: dict | None  # stats.paired_diff of the metric: mean, ci, n
    agreement: dict | None  # stats.agreement of the generated ids (needs both predictions files)

    @property
    def verdict(self) -> str | None:
        if self.diff is None or self.diff["ci"] is None:
            return None
        if not stats.distinguishable(self.diff["ci"]):
            return "indistinguishable from FKV"
        return "above FKV" if self.diff["mean"] > 0 else "below FKV"


def vs_fkv(run: Samples | None, fkv: Samples | None, metric: str) -> VsFKV | None:
    if run is None or fkv is None:
        return None
    diff = stats.paired_diff(run.metric(metric), fkv.metric(metric))
    agree = stats.agreement(run.token_ids, fkv.token_ids) if run.token_ids and fkv.token_ids else None
    return VsFKV(diff, agree)
