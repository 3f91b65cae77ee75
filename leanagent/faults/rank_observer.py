"""Rank 0's watch over the ranks Lightning's launcher spawned: a rank that exits early is named, survivors get time to say why they stop.

Lightning's own observer kills every rank at once, without naming the one that ended, so the
survivors never print their line; `install_fault_handling` puts `RankObserver` in its place
(through `leanagent.compat`, the only way in).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

from leanagent import compat
from leanagent.faults.heartbeats import print_line, read_heartbeats
from leanagent.faults.lost_ranks import report_lost
from leanagent.faults.state import EXIT_RANK_LOST, EXIT_STALLED, PREEMPTED_CODES, state

OBSERVE_S = 1.0  # how often the children are polled
LOST_GRACE_S = 10.0  # after a lost rank, how long survivors get to exit on their own before being killed
PASS_ON_GRACE_S = 5.0  # after rank 0 passed its signal on, how long the others get to stop before being killed


class RankObserver(threading.Thread):
    """Polls the spawned ranks; a child that exits non-zero is named, survivors get time to print one line."""

    def __init__(self, child_processes: list[subprocess.Popen]) -> None:
        super().__init__(daemon=True, name="leanagent-rank-observer")  # dies with rank 0
        self.child_processes = child_processes
        self.named = False
        self.reason = "another rank ended early"
        self.stopped = threading.Event()  # rank 0 is stopping them itself: their exits are no lost ranks

    def run(self) -> None:
        while True:
            time.sleep(OBSERVE_S)
            if self.check():
                return

    def check(self) -> bool:
        """One look at the children; True when there is nothing more to watch."""
        if self.stopped.is_set():
            return True
        for proc in self.child_processes:
            proc.poll()
        codes = [proc.returncode for proc in self.child_processes]
        if all(code == 0 or code in PREEMPTED_CODES for code in codes):
            # Every child finished, or stopped on a signal after rank 0's checkpoint (exit 128 + signal,
            # callbacks/preemption.py): rank 0 ends the same way on its own and says so itself, unless the
            # signal came before the ranks joined (Ctrl-C while they start).
            stopped = [code for code in codes if code]
            if stopped and not _joined():
                self._end_unjoined(stopped[0])
            return True
        failed = [(i + 1, p) for i, p in enumerate(self.child_processes) if p.returncode and p.returncode not in PREEMPTED_CODES]
        if not failed:
            return False
        self.reason = f"rank {self._global_rank(failed[0][0])} ended early"
        if not state.aborting.is_set():
            state.ending.set()
            folder = state.folder
            records = read_heartbeats(folder) if folder is not None and folder.is_dir() else {}
            for local_rank, proc in failed:
                rank = self._global_rank(local_rank)
                code = proc.returncode
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                if code not in (2, EXIT_STALLED, EXIT_RANK_LOST):  # those print their own error line
                    report_lost(folder, rank, records.get(rank), how)
                    self.named = True
        self._end_job()
        return True

    def _global_rank(self, local_rank: int) -> int:
        procs_per_node = len(self.child_processes) + 1
        return int(os.environ.get("NODE_RANK", "0") or 0) * procs_per_node + local_rank

    def _end_job(self) -> None:
        # Survivors usually fail in their next collective within a second and print one line each;
        # a rank blocked for good (NCCL, a hung step) is killed after the grace period.
        stop_children(self.child_processes, LOST_GRACE_S)
        time.sleep(LOST_GRACE_S / 2)  # the main thread normally exits (EXIT_RANK_LOST) before this
        print_line(f"error (rank 0): stopped because {self.reason}")
        os._exit(EXIT_RANK_LOST)

    def _end_unjoined(self, code: int) -> None:
        # Rank 0 waits for them in torch's rendezvous, a C++ call that runs no Python signal handler
        # until it returns: with the job's 364-day timeout, not in this run. Its own line would have come by now.
        time.sleep(LOST_GRACE_S / 2)
        if _joined():
            return
        name = signal.Signals(code - 128).name
        print_line(f"error (rank 0): stopped by {name}: the other ranks stopped on it before they joined; "
                   "nothing was trained, run the same command again")
        os._exit(code)


def _joined() -> bool:
    """Whether this process's group exists: its rendezvous with the other ranks has finished."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def stop_children(procs: list[subprocess.Popen], grace_s: float) -> None:
    """Let the spawned ranks exit on their own for `grace_s`, then kill the rest."""
    deadline = time.time() + grace_s
    while time.time() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.kill()


def pass_on_signal(signum: int, grace_s: float = PASS_ON_GRACE_S) -> None:
    """Rank 0 of Lightning's launcher, stopped by a signal outside a fit's training steps: the ranks it spawned
    stop on the same signal, instead of failing in their next collective once rank 0 is gone (one
    "no lost rank was found" line each) or waiting in it for good. `kill PID` and a container's stop reach
    rank 0 alone; after a Ctrl-C, which reached them all, the copy changes nothing (stop_on_signals ignores
    a second signal). Those still running after `grace_s`, inside a collective that waits for rank 0, are killed."""
    observer = state.observer
    if observer is None:
        return
    observer.stopped.set()
    for proc in observer.child_processes:
        if proc.poll() is None:
            try:
                proc.send_signal(signum)
            except ProcessLookupError:  # exited between the poll and the signal
                pass
    stop_children(observer.child_processes, grace_s)


def _start_observer(child_processes: list[subprocess.Popen]) -> None:
    state.observer = RankObserver(child_processes)
    state.observer.start()


def install_fault_handling() -> None:
    """Watch Lightning's spawned ranks with `RankObserver` instead of Lightning's observer. Idempotent; call before fit."""
    compat.replace_child_process_observer(_start_observer)
