"""SIGTERM and Ctrl-C outside a fit's training steps: stop with one line and exit 128 + signal.

Inside training, callbacks/preemption.py stops at the next optimizer step with a resumable
checkpoint. Everywhere else (validate, test, predict, a fit before its first step, the lifelong
runner's own evaluations) Lightning's SIGTERM handler only sets a flag, and its evaluation loop
later raises `SIGTERMException`, a `SystemExit` without a code: the process ends with status 0
and says nothing, so a preempted job looks finished (or, between evaluations, the flag is reset and
the signal is lost). Ctrl-C there becomes Lightning's bare `exit 1`. What runs in these places
writes nothing but atomically, so it can stop anywhere, at once.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from pytorch_lightning.utilities.exceptions import SIGTERMException


__all__ = ["SIGNALS", "Interrupted", "stop_on_signals"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(BaseException):
    """A signal stopped a pass; its message says how to go on. `exit_code` is 128 + the signal.

    Not an `Exception`, as KeyboardInterrupt is not: raised wherever the signal lands, it must pass through
    the `except Exception` of libraries and our own `except LeanAgentError` around optional steps (a missing
    val split, an unreadable checkpoint), which caught it and went on as if no signal had come."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


@contextmanager
def stop_on_signals(during: str, advice: str = "run the same command again") -> Iterator[None]:
    """While inside, SIGTERM and SIGINT raise `Interrupted` ("<during> stopped by SIGTERM; <advice>"),
    and so does Lightning's SIGTERMException. Handlers installed inside (a fit's preemption callback,
    a stage runner's forwarding) take over until they restore ours. Whatever else ends the block after our
    signal (the library it interrupted caught it) is that signal's `Interrupted` too. Outside the main thread: no-op."""
    received: list[int] = []

    def interrupt(signum: int) -> Interrupted:
        return Interrupted(signum, f"{during} stopped by {signal.Signals(signum).name}; {advice}")

    def handle(signum: int, frame: FrameType | None) -> None:
        if received:
            return  # already unwinding: a second signal must not interrupt the cleanup
        received.append(signum)
        raise interrupt(signum)

    previous = {}
    try:
        for signum in SIGNALS:
            previous[signum] = signal.signal(signum, handle)
    except ValueError:  # not the main thread: signals are the main thread's to handle
        pass
    try:
        yield
    except SIGTERMException:
        raise interrupt(signal.SIGTERM) from None
    except (Exception, SystemExit) as error:
        if received and not isinstance(error, Interrupted):
            # Ours was raised inside code that catches what it calls and reports something else: jsonargparse,
            # resolving a class_path, told of a bad value in the config file. The signal is what stopped it.
            raise interrupt(received[0]) from error
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
