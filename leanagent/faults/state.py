"""What this process knows about its own part in fault handling, shared by the modules of `leanagent.faults`."""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXIT_STALLED = 3  # action=abort after a stall report
EXIT_RANK_LOST = 4  # a rank died or a collective failed because one did
# Exit codes of a rank that stopped on SIGTERM or Ctrl-C once the ranks had agreed and rank 0 had saved
# (128 + signal, leanagent.cli.main): a stop on purpose, not a lost rank.
PREEMPTED_CODES = (128 + signal.SIGTERM, 128 + signal.SIGINT)
# A heartbeat's final state after a stop on a signal ("stopped by SIGTERM"): on purpose, not a lost rank.
STOPPED_BY = "stopped by "


@dataclass
class FaultState:
    heartbeat: Any = None  # this process's heartbeats.Heartbeat while a Watchdog runs
    folder: Path | None = None  # kept after the watchdog stops, for the error path in leanagent.cli.main
    rank: int | None = None
    observer: Any = None  # the running rank_observer.RankObserver (rank 0 under Lightning's launcher)
    ending: threading.Event = field(default_factory=threading.Event)  # this process decided to end the job
    aborting: threading.Event = field(default_factory=threading.Event)  # a watchdog abort: name no lost rank


state = FaultState()
