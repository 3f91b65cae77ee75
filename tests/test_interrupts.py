"""stop_on_signals in process: a signal becomes Interrupted at once, Lightning's silent SystemExit too, and the
handlers in place before come back."""

from __future__ import annotations

import os
import signal
import time

import pytest
from pytorch_lightning.utilities.exceptions import SIGTERMException

from leanagent.interrupts import SIGNALS, Interrupted, stop_on_signals


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_inside_raises_interrupted_at_once_with_its_exit_code(signum):
    before = {s: signal.getsignal(s) for s in SIGNALS}
    start = time.monotonic()
    with pytest.raises(Interrupted) as stopped:
        with stop_on_signals("test", "run it again"):
            os.kill(os.getpid(), signum)
            time.sleep(10)
    assert time.monotonic() - start < 5
    assert stopped.value.exit_code == 128 + signum
    assert str(stopped.value) == f"test stopped by {signal.Signals(signum).name}; run it again"
    assert {s: signal.getsignal(s) for s in before} == before


def test_lightnings_sigterm_exit_becomes_interrupted():
    with pytest.raises(Interrupted) as stopped:
        with stop_on_signals("validate"):
            raise SIGTERMException  # what Lightning's evaluation loop raises after its SIGTERM flag: exit status 0
    assert stopped.value.exit_code == 143


def test_a_handler_installed_inside_takes_over_until_it_restores_ours():
    seen = []
    with stop_on_signals("outer"):
        ours = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        signal.signal(signal.SIGTERM, ours)
    assert seen == [signal.SIGTERM]
