"""The stall report: which ranks made no progress, where each one is (phase, last collective, Python stack), and abort."""

from __future__ import annotations

import faulthandler
import os
import signal
import time
from pathlib import Path
from typing import Any

from leanagent.faults.flight_recorder import flight_recorder_summary, last_collective
from leanagent.faults.heartbeats import STACK_SIGNAL, describe, duration, print_line, process_state
from leanagent.faults.state import EXIT_STALLED, state

STACK_WAIT_S = 3.0  # how long the reporter waits for the other ranks' stack dumps

Records = dict[int, dict[str, Any]]


def _read_from(path: Path, offset: int) -> str:
    with open(path, errors="replace") as f:
        f.seek(offset)
        return f.read().rstrip()


def dump_stacks(folder: Path, records: Records, me: int) -> dict[int, str]:
    """Signal every rank on this host to dump its stacks; collect what each wrote."""
    sizes, stacks, pending = {}, {}, {}
    for rank, record in records.items():
        path = folder / record.get("stack_file", f"stack-rank{rank}.txt")
        sizes[rank] = path.stat().st_size if path.exists() else 0
        if rank == me:
            with open(path, "a") as f:
                faulthandler.dump_traceback(file=f, all_threads=True)
            pending[rank] = path
            continue
        process = process_state(record)
        if process is None:
            stacks[rank] = f"not available: rank {rank} runs on host {record.get('host')}"
        elif process in ("gone", "zombie"):
            stacks[rank] = "not available: the process is gone"
        elif not record.get("stacks") or record.get("state") != "running":
            stacks[rank] = f"not available: the rank is {record.get('state')}"
        else:
            try:
                os.kill(int(record["pid"]), STACK_SIGNAL)
            except OSError as e:
                stacks[rank] = f"not available: {e}"
                continue
            if process == "stopped":
                stacks[rank] = "not available: the process is stopped (SIGSTOP/SIGTSTP) and cannot dump its stack until it is continued"
            else:
                pending[rank] = path
    deadline = time.time() + STACK_WAIT_S
    last = {}
    while pending and time.time() < deadline:
        time.sleep(0.25)
        for rank, path in list(pending.items()):
            size = path.stat().st_size if path.exists() else 0
            if size > sizes[rank] and last.get(rank) == size:  # grew, then stopped growing
                pending.pop(rank)
                stacks[rank] = _read_from(path, sizes[rank])
            last[rank] = size
    for rank, path in pending.items():
        size = path.stat().st_size if path.exists() else 0
        stacks[rank] = _read_from(path, sizes[rank]) if size > sizes[rank] else f"not available: no dump within {STACK_WAIT_S:.0f} s"
    return stacks


def stall_lines(records: Records, stalled: Records, now: float, collectives: dict[int, int] | None = None) -> list[str]:
    """The grep-able first lines: `stalled: rank N (phase P, step S) has made no progress for D`.

    The likely cause first: the rank that entered the fewest collectives (when every stalled rank's
    flight recorder says), else the rank idle the longest.
    """
    collectives = collectives or {}
    by_collective = all(r in collectives for r in stalled)
    order = sorted(stalled, key=lambda r: (collectives[r] if by_collective else 0, stalled[r].get("time", now), r))
    return [
        f"stalled: rank {r} ({describe(stalled[r])}) has made no progress for {duration(now - stalled[r].get('time', now))}"
        for r in order
    ]


def format_stall_report(records: Records, stalled: Records, stall_after: float, me: int, stacks: dict[int, str],
                        now: float, folder: Path | None = None) -> str:
    collectives = {}
    for rank in records:
        last = last_collective(folder / f"flight-recorder-rank{rank}.json") if folder is not None else None
        if last is not None and last.get("collective_seq_id") is not None:
            collectives[rank] = int(last["collective_seq_id"])
    lines = stall_lines(records, stalled, now, collectives)
    world = next(iter(records.values())).get("world_size", len(records)) if records else 0
    lines.append(
        f"watchdog: {len(stalled)} of {world} rank(s) made no progress for more than {duration(stall_after)} "
        f"(report by rank {me} at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now))})"
    )
    for rank in range(world):
        record = records.get(rank)
        if record is None:
            lines.append(f"  rank {rank}: no heartbeat here (on another node without a shared folder, or not started)")
            continue
        process = process_state(record)
        lines.append(
            f"  rank {rank}: {describe(record)}, last progress {now - record.get('time', now):.1f} s ago, "
            f"in this phase for {now - record.get('phase_since', now):.1f} s, pid {record.get('pid')} on {record.get('host')}"
            f", {record.get('state')}" + (f", process {process}" if process else "")
        )
    lines.append("  (a rank waiting in a collective for a stalled rank makes no progress either; the rank listed first, "
                 "behind in collectives or else idle the longest, is the likely cause)")
    for rank in range(world):
        summary = flight_recorder_summary(folder / f"flight-recorder-rank{rank}.json") if folder is not None else None
        if summary:
            lines.append(f"  rank {rank}: {summary}")
    for rank in sorted(stacks):
        lines.append(f"--- Python stack of rank {rank} ---")
        lines.append(stacks[rank])
    return "\n".join(lines) + "\n"


def write_stall_report(folder: Path, records: Records, stalled: Records, stall_after: float, me: int, action: str) -> Path:
    """Print the report and append it to `stall-report.txt` in rank 0's log folder (else the heartbeat folder)."""
    stacks = dump_stacks(folder, records, me)
    now = time.time()
    text = format_stall_report(records, stalled, stall_after, me, stacks, now, folder)
    log_dir = records.get(0, {}).get("log_dir")
    target = Path(log_dir) if log_dir and Path(log_dir).is_dir() else folder
    path = target / "stall-report.txt"
    try:
        with open(path, "a") as f:
            f.write(text + "\n")
    except OSError:
        path = folder / "stall-report.txt"
        with open(path, "a") as f:
            f.write(text + "\n")
    print_line(text + f"watchdog: report written to {path}" + ("" if action == "abort" else "; the job keeps waiting (watchdog.action=report)"))
    return path


def abort(records: Records, stalled: Records, path: Path, me: int) -> None:
    """End the job: kill the other ranks on this host, exit with EXIT_STALLED."""
    state.aborting.set()
    state.ending.set()
    if state.heartbeat is not None:
        state.heartbeat.mark("exited: watchdog abort")
    now = time.time()
    first = min(stalled, key=lambda r: (stalled[r].get("time", now), r))
    record = stalled[first]
    print_line(
        f"error: watchdog: rank {first} made no progress for {duration(now - record.get('time', now))} "
        f"({describe(record)}); aborting the job (watchdog.action=abort, report in {path})"
    )
    for rank, rec in records.items():
        if rank != me and process_state(rec) not in (None, "gone"):
            try:
                os.kill(int(rec["pid"]), signal.SIGKILL)
            except OSError:
                pass
    os._exit(EXIT_STALLED)
