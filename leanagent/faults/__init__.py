"""Hangs and lost ranks in long DDP runs: per-rank heartbeats, a stall watchdog, one-line fault reports.

LeanAgent keeps a 364-day collective timeout, so a rank that hangs or dies would make the others
wait for a year. This package makes such a job say which rank is stuck and where:

* **Heartbeats** (`heartbeats.py`). Every rank writes `rank<N>.json` in a run folder that all ranks
  of a node derive without communicating: its phase (`data loading barrier`, `train step`,
  `validation`, `corpus embedding`, `Fisher`, ...), step, time of last progress and pid. Files are
  replaced atomically at most about once a second; no collective is involved.
* **Watchdog** (`watchdog.py`). The `Watchdog` callback starts a daemon thread in every rank that
  polls once a second. When a rank has made no progress for `stall_after`, the lowest rank whose
  own thread is alive prints one report (`stall_report.py`; first lines
  `stalled: rank N (phase P, step S) has made no progress for H:MM:SS`) with the Python stack of
  every rank on its host and which collective each rank entered last (`flight_recorder.py`). With
  `action="abort"` the reporter then kills the ranks on its host and exits with `EXIT_STALLED`.
* **Lost ranks** (`lost_ranks.py`, `rank_observer.py`, `collectives.py`). A rank killed from outside
  is named once (`error: rank N ... was lost ...`) by whichever process notices first: the
  launcher's child observer, a survivor whose collective failed, or a watchdog thread that finds
  the pid gone. Survivors print one `error (rank N): ...` line and exit with `EXIT_RANK_LOST`.

The watchdog sees the ranks whose heartbeat files it can read: all ranks of its own node, and
those of other nodes only when the run folder is on a filesystem they share.
"""
