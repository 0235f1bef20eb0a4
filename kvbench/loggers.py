"""Experiment trackers a run reports to (`logger=` group). The runner never fails because of one."""

from __future__ import annotations


class NullLogger:
    """logger=none: nothing beyond runs.jsonl and the predictions file."""

    def log_run(self, record: dict, predictions: list[dict], config: dict) -> None:
        pass
