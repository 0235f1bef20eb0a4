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
    """The record of a run with this identity that ended ok or oom, if any (for skip_existing)."""
    for rec in reversed(read_records(results_dir)):
        if rec.get("config_hash") == config_hash and rec.get("status") in ("ok", "oom"):
            return rec
    return None
