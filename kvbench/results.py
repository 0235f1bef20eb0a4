"""Where runs go: one JSON line per finished run in runs.jsonl, predictions in their own file.

Appends are atomic: the line is written by a single `write` on a descriptor opened with O_APPEND,
under an exclusive `flock` (several sweep processes may share a results directory), so a killed
run leaves no partial line; a reader still skips any line that does not parse. Prediction files are
written to a temporary name and renamed into place.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from pathlib import Path

RUNS = "runs.jsonl"


def append_record(results_dir: str | Path, record: dict) -> Path:
    path = Path(results_dir) / RUNS
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(record, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        written = os.write(fd, data)
        if written != len(data):  # disk full: never leave half a record behind
            os.ftruncate(fd, os.fstat(fd).st_size - written)
            raise OSError(f"short write to {path}")
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def read_records(results_dir: str | Path) -> list[dict]:
    path = Path(results_dir) / RUNS
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def write_jsonl(path: str | Path, rows: list[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        for row in rows:
            f.write(json.dumps(row, default=str) + "\n")
    os.replace(tmp, path)
    return path


def read_jsonl(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def finished(results_dir: str | Path, config_hash: str) -> dict | None:
    """The record that makes a skip_existing run of this identity skip, or None (run it).

    Final: an "ok" record, or an "oom" one decided by the account (`oom_kind: "accounted"`; an oom
    record without `oom_kind`, written before the field existed, counts as accounted). A measured
    oom (`oom_kind: "measured"`, an allocator's, e.g. CUDA's: may be transient) is retried once: it
    is final only once the identity has two of them. Records match on `config_hash` or, for records
    written before the hash used the resolved device kind, on the hash recomputed from their config.
    """
    from kvbench.config import record_hash

    same = [r for r in read_records(results_dir) if r.get("config_hash") == config_hash or record_hash(r) == config_hash]
    measured = sum(1 for r in same if r.get("status") == "oom" and r.get("oom_kind") == "measured")
    for rec in reversed(same):
        status, kind = rec.get("status"), rec.get("oom_kind")
        if status == "ok" or (status == "oom" and (kind != "measured" or measured >= 2)):
            return rec
    return None
