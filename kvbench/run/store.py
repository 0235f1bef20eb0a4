"""Saving a run's files: predictions, scores, then the record, and where they go when the results folder fails.

The preflight checked the results folder before the model loaded, but a disk can still fill up during a
long run. Nothing finished is lost: whatever cannot be written to `results_dir` goes to a rescue folder
(`rescue_dir`: the temp folder, else the home folder), the record notes it, and once everything is
written somewhere `RecordNotWritten` says where (the CLI prints it in one line). The file formats and
the runs.jsonl lock are kvbench.results'.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from omegaconf import DictConfig

from kvbench import results
from kvbench.scoring import score_rows


class RecordNotWritten(OSError):
    """The results folder failed after the run (a disk filling up): the record and predictions went to `rescue`."""

    def __init__(self, message: str, rescue: Path):
        super().__init__(message)
        self.rescue = rescue


def rescue_dir(run_id: str) -> Path:
    """Where a run's files go when its results folder cannot take them: the temp folder, else the home folder."""
    for root in (Path(tempfile.gettempdir()), Path.home()):
        path = root / "kvbench-rescue" / run_id
        try:
            path.mkdir(parents=True, exist_ok=True)
            return path
        except OSError:
            continue
    raise OSError("no writable folder for the rescued record (temp and home folders both failed)")


def save(cfg: DictConfig, record: dict, rows: list[dict], claim) -> None:
    """Predictions, scores, then the record, into results_dir; what fails goes to `rescue_dir`, never lost
    (RecordNotWritten says where, once everything is written somewhere). `claim` (kvbench.results.Claim or
    None) is released when the record is appended."""
    failed, rescue = [], None

    def place(kind: str, name: str) -> Path:
        return Path(cfg.results_dir) / kind / name if rescue is None else rescue / name

    for kind, data, key in (("predictions", rows, "predictions_path"), ("scores", score_rows(rows) if rows else [],
                                                                        "scores_path")):
        if not rows:
            break
        name = f"{record['run_id']}.jsonl" if rescue is None else f"{kind}.jsonl"
        try:
            record[key] = str(results.write_jsonl(place(kind, name), data))
        except OSError as e:
            failed.append(f"{place(kind, name)}: {e.strerror or e}")
            rescue = rescue or rescue_dir(record["run_id"])
            record[key] = str(results.write_jsonl(rescue / f"{kind}.jsonl", data))
    if rescue is not None:
        record["notes"].append(f"the results folder failed ({'; '.join(failed)}): files written to {rescue}")
    try:
        results.append_record(cfg.results_dir, record, release=claim)
    except OSError as e:
        failed.append(f"{Path(cfg.results_dir) / results.RUNS}: {e.strerror or e}")
        rescue = rescue or rescue_dir(record["run_id"])
        record["notes"].append(f"the record could not be appended ({failed[-1]}): written to {rescue}")
        results.append_record(rescue, record)
    if failed:
        raise RecordNotWritten(f"could not write {'; '.join(failed)}: the run's record and predictions are in "
                               f"{rescue}", rescue)
