"""Hydra callbacks that sweep tests load into job processes (submitit's own included), where a test
cannot monkeypatch: `TermEvictingRun` makes a run that evicts (kv_size set) get SIGTERM, as a
scheduler's stop would, while it generates."""

from __future__ import annotations

import os
import signal

from hydra.experimental.callback import Callback


class TermEvictingRun(Callback):
    def on_job_start(self, config, **kwargs) -> None:
        if config.policy.get("kv_size") is None:
            return
        from kvbench import run as kvrun

        execute = kvrun.static.execute

        def term_then_execute(*args, **kw):
            os.kill(os.getpid(), signal.SIGTERM)
            return execute(*args, **kw)

        kvrun.static.execute = term_then_execute
