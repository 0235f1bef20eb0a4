"""SIGTERM and SIGINT during a run: the run stops, its record is still written whole, then the process exits.

SLURM and most schedulers send SIGTERM before killing a job; Ctrl-C sends SIGINT. While a run works, either
raises `Terminated` (once), which the life cycle records as status "interrupted"; while the record is
being written the signal waits (`TermGuard.defer`), so no half record is left; then `uninstall` exits
quietly with 128 + the signal's number (143 for SIGTERM, 130 for SIGINT), as a shell would report it.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field


class Terminated(BaseException):
    """SIGTERM (what SLURM and most schedulers send) or SIGINT (Ctrl-C) during a run; `args[0]` names it."""


SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT"}


@dataclass
class TermGuard:
    """SIGTERM and SIGINT during one run: raise Terminated (once) while the run works; while its record is
    written (`defer`) they wait; `uninstall` then stops the process quietly (exit code 128 + the signal's
    number: 143 for SIGTERM, 130 for SIGINT) if one came."""

    defer: bool = False
    fired: int | None = None  # the signal that came
    previous: dict = field(default_factory=dict)

    def install(self) -> TermGuard:
        if _main_thread():  # signal handlers live in the main thread only
            self.previous = {sig: signal.signal(sig, self.handler) for sig in SIGNALS}
        return self

    def handler(self, signum, frame) -> None:
        if self.fired is None:
            self.fired = signum
            if not self.defer:
                raise Terminated(SIGNALS[signum])

    def uninstall(self) -> None:
        for sig, previous in self.previous.items():
            signal.signal(sig, previous)
        self.previous = {}
        if self.fired is not None:
            raise SystemExit(128 + self.fired)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
