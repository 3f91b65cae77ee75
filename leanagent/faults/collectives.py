"""A survivor's end: a collective failed because another rank died; name that rank once, say one line, exit.

Without this a survivor prints gloo's or NCCL's traceback, and every survivor prints its own. A rank
that stopped on a signal sent to it alone is no lost rank: that stop is named instead, with its exit code.
"""

from __future__ import annotations

import os
import re
import time

from leanagent.faults import rank_observer
from leanagent.faults.heartbeats import current_rank, external_launcher, print_line
from leanagent.faults.lost_ranks import parent_rank, report_lost_ranks, report_stopped_rank, wait_for_claims
from leanagent.faults.state import EXIT_RANK_LOST, state

COLLECTIVE_ERROR_MARKERS = (
    "Connection reset by peer", "Connection closed by peer", "Broken pipe", "[gloo", "gloo/",
    "NCCL error", "NCCL communicator", "ProcessGroupNCCL", "ProcessGroupGloo", "DistBackendError", "Socket Timeout",
)


def collective_error(error: BaseException | None) -> BaseException | None:
    """The distributed-communication error in `error`'s chain, if any."""
    from torch.distributed import DistError

    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, DistError):
            return error
        if isinstance(error, RuntimeError) and any(m in str(error) for m in COLLECTIVE_ERROR_MARKERS):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def one_line(error: BaseException, limit: int = 200) -> str:
    """`RuntimeError: Read error [127.0.0.1]:22916: Connection reset by peer` from gloo's longer message."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = next((line for line in lines if "by peer" in line or "error" in line.lower()), lines[0] if lines else "")
    text = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", text).split(". This is typically")[0]
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(error).__name__}: {text}"


def handle_collective_error(error: BaseException) -> int:
    """Name the lost rank (once per job), print one line for this rank, return the exit code."""
    rank = current_rank()
    state.ending.set()
    named = False
    observer = state.observer
    stopped = report_stopped_rank(state.folder, exclude=rank)
    if stopped is not None:  # a stop on purpose: no lost rank, and the broken collective is only its consequence
        if observer is not None:
            observer.stopped.set()
            rank_observer.stop_children(observer.child_processes, rank_observer.LOST_GRACE_S / 2)
        return stopped
    if observer is not None:  # Lightning's launcher: the observer names the child with its exit signal
        deadline = time.time() + 3.0
        while not observer.named and time.time() < deadline:
            time.sleep(0.1)
        named = observer.named
    elif os.environ.get("LOCAL_RANK", "0") != "0" and not external_launcher():
        # A rank spawned by Lightning: rank 0's observer knows how a child died (its exit signal); give it a moment.
        wait_for_claims(state.folder, exclude={rank, parent_rank()}, wait_s=2.5)
    named = report_lost_ranks(exclude=rank) or named
    if not named:
        print_line("error: a collective failed because another rank stopped communicating (it died or its node "
                   "is unreachable); no lost rank was found on this host")
    print_line(f"error (rank {rank if rank is not None else '?'}): collective failed: {one_line(error)}")
    if observer is not None:
        rank_observer.stop_children(observer.child_processes, rank_observer.LOST_GRACE_S / 2)
    return EXIT_RANK_LOST
