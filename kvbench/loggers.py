"""Experiment trackers a run reports to (`logger=` group). The runner never fails because of one.

A logger has two methods: `start()`, called before the run, returns what the record keeps about
the logger (its `logger` field: e.g. the W&B mode actually used) or None; `log_run(record,
predictions, config)`, called once the run's record is on disk. logger=none is below;
logger=wandb is kvbench.wandb_logger.WandbLogger.
"""

from __future__ import annotations


class NullLogger:
    """logger=none: nothing beyond runs.jsonl and the predictions file."""

    def start(self) -> dict | None:
        return None

    def log_run(self, record: dict, predictions: list[dict], config: dict) -> None:
        pass
