"""Ranks of this host that died: found from their heartbeats, named once per job however many processes notice."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from leanagent.faults.heartbeats import claim, describe, duration, print_line, process_state, read_heartbeats
from leanagent.faults.state import STOPPED_BY, state


def lost_ranks(folder: Path | None, exclude: int | None = None) -> list[tuple[int, dict[str, Any], str]]:
    """Ranks on this host whose heartbeat says running but whose process is gone (or a zombie)."""
    if folder is None or not folder.is_dir():
        return []
    lost = []
    for rank, record in read_heartbeats(folder).items():
        if rank == exclude or record.get("state") != "running":
            continue
        if process_state(record) in ("gone", "zombie"):
            lost.append((rank, record, "its process is gone"))
    return lost


def lost_rank_line(rank: int, record: dict[str, Any] | None, how: str) -> str:
    where = ""
    if record:
        where = f"; its last known {describe(record)} ({duration(time.time() - record.get('time', time.time()))} before)"
    pid = f" (pid {record['pid']})" if record else ""
    return f"error: rank {rank}{pid} was lost: {how}{where}; stopping the other ranks"


def report_lost(folder: Path | None, rank: int, record: dict[str, Any] | None, how: str) -> bool:
    """Print the one `error:` line for a lost rank; False if another process already did."""
    if folder is not None and folder.is_dir() and not claim(folder, f"lost-rank{rank}.claim"):
        return False
    print_line(lost_rank_line(rank, record, how))
    return True


def report_lost_ranks(folder: Path | None = None, exclude: int | None = None, wait_s: float = 3.0) -> bool:
    """Name the ranks of this host that died (waiting up to `wait_s` for them to show as gone)."""
    folder = folder or state.folder
    deadline = time.time() + wait_s
    while True:
        found = lost_ranks(folder, exclude)
        if found or time.time() >= deadline:
            break
        time.sleep(0.2)
    for rank, record, how in found:
        report_lost(folder, rank, record, how)
    return bool(found)


def report_stopped_rank(folder: Path | None, exclude: int | None = None) -> int | None:
    """A rank of this host that stopped on a signal sent to it alone (`kill PID` outside training steps), which
    leaves the others failing in their next collective: named once per job. 128 + that signal, or None."""
    if folder is None or not folder.is_dir():
        return None
    for rank, record in read_heartbeats(folder).items():
        final = str(record.get("state", ""))
        name = final.removeprefix(STOPPED_BY)
        if rank == exclude or name == final or name not in signal.Signals.__members__:
            continue
        if claim(folder, f"stopped-rank{rank}.claim"):
            print_line(f"error: rank {rank} (pid {record.get('pid', '?')}) stopped on {name}; the other ranks stop "
                       "with it; run the same command again")
        return 128 + signal.Signals[name]
    return None


def parent_rank() -> int | None:
    """The rank of this process's parent if it is a rank (Lightning's rank 0 for the ranks it spawned)."""
    folder = state.folder
    if folder is None or not folder.is_dir():
        return None
    records = read_heartbeats(folder)
    mine = records.get(state.rank) if state.rank is not None else None
    parent = mine.get("ppid") if mine else os.getppid()  # recorded at start: the launcher may be gone by now
    return next((r for r, rec in records.items() if rec.get("pid") == parent), None)


def wait_for_claims(folder: Path | None, exclude: set, wait_s: float) -> None:
    """Wait until every lost rank of this host (but `exclude`) was named by someone, or `wait_s` passed."""
    deadline = time.time() + wait_s
    while folder is not None and time.time() < deadline:
        lost = [r for r, _, _ in lost_ranks(folder) if r not in exclude]
        if lost and all((folder / f"lost-rank{r}.claim").exists() for r in lost):
            return
        time.sleep(0.1)
