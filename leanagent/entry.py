"""The command line's first step: a Ctrl-C while the libraries load (seconds) is one line and exit 130.

Until the CLI installs its own handlers (leanagent/interrupts.py, the preemption callback), and again
after it restores them, SIGINT ends the process at once instead of raising KeyboardInterrupt. An
exception raised into a library that is being imported does not always reach us: inside a C++
callback (torch, pybind11) it aborts the process (SIGABRT, which rank 0 reads as a lost rank), and a
half-imported numpy made torch's import recurse until RecursionError (exit 1). Nothing is written in
these windows but atomically, so stopping there loses nothing.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

EXIT_INTERRUPTED = 128 + signal.SIGINT


def _is_first_rank() -> bool:
    return os.environ.get("LOCAL_RANK", "0") in ("", "0") and os.environ.get("NODE_RANK", "0") in ("", "0")


def _say_stopped() -> None:
    if _is_first_rank():  # every rank got the same Ctrl-C; one line is enough
        print("error: stopped by SIGINT before the command started or after it ended; nothing was half-written; "
              "run the same command again", file=sys.stderr, flush=True)


def _stop_at_once(signum: int, frame: FrameType | None) -> None:
    _say_stopped()
    try:
        sys.stdout.flush()
    except (OSError, ValueError):  # a closed or broken stdout must not turn the stop into a traceback
        pass
    os._exit(EXIT_INTERRUPTED)


def run() -> None:
    # Python installs its KeyboardInterrupt handler only where SIGINT was not ignored at start
    # (`nohup`, a background job of a script): such a process keeps ignoring it.
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _stop_at_once)
    try:
        from leanagent.cli import main

        main()
    except KeyboardInterrupt:  # raised by another handler that a library put in place of ours
        _say_stopped()
        sys.exit(EXIT_INTERRUPTED)
