"""Benchmarks that print figures: `python -m benchmarks.<name> --help`.

Run so, Python loads this package before the benchmark's module, whose imports (torch, Lightning) take
seconds. A Ctrl-C then is one line and exit 130, as in the app (leanagent/entry.py), not a
KeyboardInterrupt traceback; `arguments.run` installs the benchmark's own handlers once it starts.
"""

from __future__ import annotations

import os
import signal
import sys


def _stopped_while_loading(signum: int, frame: object) -> None:
    # Nothing is written before a benchmark starts, so it can end here, at once.
    print("error: the benchmark stopped by SIGINT before it started; run the same command again", file=sys.stderr, flush=True)
    os._exit(128 + signum)


# `python -m benchmarks.X` sets argv[0] to "-m" until X is found: only then, never when tests import a benchmark.
if sys.argv[:1] == ["-m"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _stopped_while_loading)
