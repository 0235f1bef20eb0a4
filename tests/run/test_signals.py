"""kvbench.run.signals: a signal during the run raises Terminated once; one while the record is written
waits, and the process then exits 128 + its number; the previous handlers come back."""

from __future__ import annotations

import os
import signal

import pytest

from kvbench.run.signals import TermGuard, Terminated


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_while_running_raises_then_exits_quietly(sig, code):
    before = signal.getsignal(sig)
    guard = TermGuard().install()
    with pytest.raises(Terminated, match=signal.Signals(sig).name):
        os.kill(os.getpid(), sig)
    guard.defer = True
    os.kill(os.getpid(), sig)  # a second one while the record is written: no second Terminated
    with pytest.raises(SystemExit) as exc:
        guard.uninstall()
    assert exc.value.code == code and signal.getsignal(sig) is before


def test_a_signal_while_writing_waits_for_the_record():
    guard = TermGuard(defer=True).install()
    os.kill(os.getpid(), signal.SIGTERM)  # nothing raised here
    assert guard.fired == signal.SIGTERM
    with pytest.raises(SystemExit) as exc:
        guard.uninstall()
    assert exc.value.code == 143


def test_no_signal_no_exit():
    before = signal.getsignal(signal.SIGTERM)
    guard = TermGuard().install()
    assert signal.getsignal(signal.SIGTERM) != before
    guard.uninstall()  # returns: nothing came
    assert signal.getsignal(signal.SIGTERM) is before
