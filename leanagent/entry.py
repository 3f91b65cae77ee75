"""The command line's first step: a Ctrl-C while the libraries load (seconds) is one line, not a traceback.

Once the CLI runs, its own handlers take over (leanagent/interrupts.py, the preemption callback)."""

from __future__ import annotations

import os
import sys


def run() -> None:
    try:
        from leanagent.cli import main

        main()
    except KeyboardInterrupt:  # before the CLI's handlers are installed, or after they are restored
        if os.environ.get("LOCAL_RANK", "0") in ("", "0") and os.environ.get("NODE_RANK", "0") in ("", "0"):
            print("error: stopped by SIGINT before the command started or after it ended; nothing was half-written; "
                  "run the same command again", file=sys.stderr)
        sys.exit(130)
