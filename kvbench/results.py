"""Where runs go: one JSON line per finished run in runs.jsonl, predictions in their own file.

Appends cannot glue: the line is written by a single `write` on a descriptor opened with O_APPEND,
under an exclusive `flock` (several sweep processes may share a results directory), and if the file
does not end in a newline (a half line left by a crashed writer or a copy cut short) one is written
first, under the same lock, so the new record always starts a line of its own.

The reader is tolerant (`read_records`, used by skip_existing, kvbench-report and kvbench-reproduce):
bytes are decoded leniently (a bad byte becomes U+FFFD), and a line that is not a JSON object with
the REQUIRED fields is skipped; their count and line numbers are said once per file state (one
warning, not one per line or per call).

Claims (`claim`): in a sweep (skip_existing) a run first claims its configuration under the same
lock: a configuration already recorded ok/oom is skipped, one claimed by a running job (a file
`claims/<config_hash>` whose `flock` a live process holds) is not started again, and a claim whose
holder died (the kernel drops its lock) is taken over. The claim is released under the lock when
the record is appended. Prediction files are written to a temporary name and renamed into place.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

RUNS = "runs.jsonl"
CLAIMS = "claims"
REQUIRED = ("run_id", "config_hash", "status")  # a line without them is no record
log = logging.getLogger("kvbench")
_warned: set[tuple] = set()


@contextlib.contextmanager
def locked(results_dir: str | Path) -> Iterator[int]:
    """runs.jsonl opened for appending under an exclusive flock; yields its descriptor."""
    path = Path(results_dir) / RUNS
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def _ends_in_newline(fd: int) -> bool:
    size = os.fstat(fd).st_size
    return size == 0 or os.pread(fd, 1, size - 1) == b"\n"


def append_record(results_dir: str | Path, record: dict, release: Claim | None = None) -> Path:
    """Append `record` as one line (after a newline if the file lacks its last one); release `release`."""
    data = (json.dumps(record, default=str) + "\n").encode()
    with locked(results_dir) as fd:
        if not _ends_in_newline(fd):  # a damaged last line: never glue this record to it
            os.write(fd, b"\n")
        written = os.write(fd, data)
        if written != len(data):  # disk full: never leave half a record behind
            os.ftruncate(fd, os.fstat(fd).st_size - written)
            raise OSError(f"short write to {Path(results_dir) / RUNS}")
        os.fsync(fd)
        if release is not None:
            release.release()
    return Path(results_dir) / RUNS


def read_records(results_dir: str | Path, required: tuple[str, ...] = REQUIRED) -> list[dict]:
    """Every usable record of runs.jsonl in file order; unusable lines are skipped with one warning."""
    path = Path(results_dir) / RUNS
    if not path.exists():
        return []
    raw = path.read_bytes()
    out, bad = [], []
    for n, line in enumerate(raw.decode("utf-8", errors="replace").split("\n"), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = None
        if isinstance(rec, dict) and all(k in rec for k in required):
            out.append(rec)
        else:
            bad.append(n)
    if bad:
        key = (str(path.resolve()), len(raw), tuple(bad))
        if key not in _warned:
            _warned.add(key)
            shown = ", ".join(map(str, bad[:20])) + (", ..." if len(bad) > 20 else "")
            log.warning("%s: skipped %d line(s) that are not records (line %s)", path, len(bad), shown)
    return out


def probe_writable(folder: str | Path) -> None:
    """Make `folder` if needed and write (then remove) a probe file in it; OSError when it cannot be written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=folder, prefix=".kvbench-write-check-")
    os.close(fd)
    os.unlink(probe)


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


# ------------------------------------------------------------------------------------------ claims
@dataclass
class Claim:
    """The outcome of `claim`: the finished record, or who holds the claim, or this process's claim."""

    path: Path
    done: dict | None = None
    held_by: str | None = None  # "pid N on HOST" of the live holder
    fd: int | None = None  # ours: the open, flock-ed claim file

    def release(self) -> None:
        """Drop this process's claim (call under `locked`; `append_record(release=...)` does)."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(self.fd)
            self.fd = None


def claim(results_dir: str | Path, config_hash: str) -> Claim:
    """Under the runs.jsonl lock: skip if recorded, defer to a live holder, else claim it for this process."""
    path = Path(results_dir) / CLAIMS / config_hash
    with locked(results_dir):
        done = finished(results_dir, config_hash)
        if done is not None:
            return Claim(path, done=done)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live process holds it (a dead one's lock is gone with it)
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            return Claim(path, held_by=holder)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        return Claim(path, fd=fd)


def release(results_dir: str | Path, c: Claim | None) -> None:
    """Release `c` under the lock (a run that leaves no record)."""
    if c is not None and c.fd is not None:
        with locked(results_dir):
            c.release()
