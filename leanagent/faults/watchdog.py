"""The `Watchdog` callback (config key `watchdog:`): heartbeats from Lightning hooks and a thread per rank that watches them.

`beat()` is the entry point for code outside Lightning's hooks (barriers, corpus embedding, the
Fisher pass); a forward pre-hook on the LightningModule counts each forward call as progress.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from datetime import timedelta
from typing import Any, Literal

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback

from leanagent.errors import LeanAgentError
from leanagent.faults.flight_recorder import dump_flight_recorder, set_dump_prefix
from leanagent.faults.heartbeats import Heartbeat, external_launcher, heartbeat_folder, print_line, read_heartbeats
from leanagent.faults.lost_ranks import lost_ranks, report_lost, report_lost_ranks
from leanagent.faults.stall_report import abort, write_stall_report
from leanagent.faults.state import EXIT_RANK_LOST, STOPPED_BY, state

log = logging.getLogger("leanagent")

POLL_S = 1.0  # the watchdog thread's period
ALIVE_S = 6.0  # a rank whose thread has not written for this long cannot report (stopped or frozen)


def beat(phase: str, step: Any = None, trainer: pl.Trainer | None = None) -> None:
    """Record that this rank entered `phase` (at `step`). Cheap; a no-op when no Watchdog runs.

    With `trainer`, starts that trainer's Watchdog callback if it has not started yet (the data
    loading barrier runs before the Watchdog's own `setup` hook).
    """
    heartbeat = state.heartbeat
    if heartbeat is None and trainer is not None:
        watchdog = next((c for c in trainer.callbacks if isinstance(c, Watchdog)), None)
        if watchdog is not None:
            watchdog.start(trainer)
            heartbeat = state.heartbeat
    if heartbeat is not None:
        heartbeat.beat(phase, step)


def progress() -> None:
    """Progress inside the current phase (called on every forward of the LightningModule)."""
    heartbeat = state.heartbeat
    if heartbeat is not None:
        heartbeat.progress()


def _keep_step() -> Any:
    heartbeat = state.heartbeat
    return heartbeat.record.get("step") if heartbeat is not None else None


class Watchdog(Callback):
    """Reports ranks that make no progress for `stall_after`; on by default in both configs.

    Args:
        stall_after: how long a rank may go without progress before the report (e.g. `0:30:00`).
        action: `report` logs the report and lets the job wait; `abort` then ends the job with
            exit code 3 so that a scheduler can restart it.
    """

    def __init__(self, stall_after: timedelta = timedelta(minutes=30), action: Literal["report", "abort"] = "report") -> None:
        if isinstance(stall_after, (int, float)):
            stall_after = timedelta(seconds=stall_after)
        if not isinstance(stall_after, timedelta) or stall_after.total_seconds() <= 0:
            raise LeanAgentError(f"watchdog.stall_after must be a positive duration like '0:30:00', got {stall_after!r}")
        if action not in ("report", "abort"):
            raise LeanAgentError(f"watchdog.action must be 'report' or 'abort', got {action!r}")
        self.stall_after = stall_after
        self.action = action
        self._thread: WatchThread | None = None
        self._hook = None
        # Lightning's launcher spawns ranks 1..N-1 during fit; they inherit this and share the run folder.
        if not external_launcher() and os.environ.get("LOCAL_RANK", "0") == "0":
            os.environ["LEANAGENT_RUN_ID"] = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"

    def start(self, trainer: pl.Trainer) -> None:
        if state.heartbeat is not None:
            return
        folder = heartbeat_folder(trainer)
        try:
            heartbeat = Heartbeat(folder, trainer)
        except OSError as e:
            log.warning("watchdog off: cannot write heartbeats in %s (%s)", folder, e)
            return
        state.heartbeat, state.folder, state.rank = heartbeat, folder, heartbeat.rank
        state.ending.clear()
        set_dump_prefix(folder)
        module = trainer.lightning_module
        if module is not None:
            self._hook = module.register_forward_pre_hook(lambda *_: progress())
        self._thread = WatchThread(heartbeat, self.stall_after, self.action)
        self._thread.start()
        if trainer.global_rank == 0:
            log.info("watchdog: heartbeats in %s, report after %s without progress (action: %s)",
                     folder, self.stall_after, self.action)

    def stop(self, final_state: str = "finished") -> None:
        heartbeat = state.heartbeat
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if heartbeat is not None:
            state.heartbeat = None
            heartbeat.close(final_state)

    # Phases.
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.start(trainer)
        beat("data loading", trainer=trainer)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        beat("train step", f"{batch_idx} of epoch {trainer.current_epoch}")

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        beat("train step (backward)", _keep_step())

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer) -> None:
        beat("train step (optimizer)", _keep_step())

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        beat("after train step", f"{batch_idx} of epoch {trainer.current_epoch}")

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        beat("validation")

    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        beat("validation", batch_idx)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        beat("after validation")

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        beat("test")

    def on_test_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        beat("test", batch_idx)

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        beat("predict")

    def on_predict_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int,
                               dataloader_idx: int = 0) -> None:
        beat("predict", batch_idx)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        beat("after training")

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.stop(final_state(exception))

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.stop("finished")


def final_state(exception: BaseException) -> str:
    """`stopped by SIGTERM` for a stop on a signal (Interrupted, Preempted: both carry `signum`), else `failed`:
    the other ranks, whose collectives then fail, say why (faults/collectives.py)."""
    signum = getattr(exception, "signum", None)
    return f"{STOPPED_BY}{signal.Signals(signum).name}" if isinstance(signum, int) else "failed"


class WatchThread(threading.Thread):
    """Every rank's daemon: refreshes its own heartbeat, names lost ranks, handles each stall episode once."""

    def __init__(self, heartbeat: Heartbeat, stall_after: timedelta, action: str) -> None:
        super().__init__(daemon=True, name="leanagent-watchdog")
        self.heartbeat = heartbeat
        self.folder = heartbeat.folder
        self.stall_after = stall_after.total_seconds()
        self.action = action
        self._stop_event = threading.Event()
        self._reported: dict[int, int] = {}  # rank -> seq at the last report
        self._ppid = os.getppid()
        # Only a rank started by a launcher dies with it; Lightning's rank 0 may outlive its shell (nohup).
        self._launched = "TORCHELASTIC_RUN_ID" in os.environ or os.environ.get("LOCAL_RANK", "0") != "0"
        self._seen_all = False

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(POLL_S):
            try:
                self.heartbeat.flush()
                if self._parent_gone():
                    return
                self.check()
            except Exception as e:  # the watchdog must never take a rank down
                log.debug("watchdog: %s", e)

    def _parent_gone(self) -> bool:
        """A rank whose launcher (Lightning's rank 0, or torchrun's agent) died would be an orphan."""
        if not self._launched or os.getppid() == self._ppid or state.ending.is_set():
            return False
        state.ending.set()
        time.sleep(2.0)  # the main thread usually fails in a collective meanwhile and prints its own line
        if self._stop_event.is_set():
            return True  # this rank finished normally meanwhile
        self.heartbeat.mark("exited: launcher gone")
        report_lost_ranks(self.folder, exclude=self.heartbeat.rank, wait_s=0)
        print_line(f"error (rank {self.heartbeat.rank}): the process that launched this rank (pid {self._ppid}) is gone; exiting")
        os._exit(EXIT_RANK_LOST)

    def check(self) -> None:
        records = read_heartbeats(self.folder)
        me = self.heartbeat.rank
        now = time.time()
        if not self._seen_all and me == 0:
            world = self.heartbeat.record["world_size"]
            if set(range(world)) <= set(records):
                self._seen_all = True
                log.info("watchdog: sees ranks %s of %d in %s", sorted(records), world, self.folder)
        # Lost ranks on this host (a rank killed from outside whose error the collectives do not raise).
        if not state.ending.is_set():
            for rank, record, how in lost_ranks(self.folder, exclude=me):
                if now - record.get("alive", now) > 2 * POLL_S:
                    report_lost(self.folder, rank, record, how)
        stalled = {r: rec for r, rec in records.items() if rec.get("state") == "running" and now - rec.get("time", now) > self.stall_after}
        if self._reported:
            if any(r in stalled and stalled[r].get("seq") == seq for r, seq in self._reported.items()):
                return  # the same episode: handled already
            self._reported = {}
        if not stalled:
            return
        # Every rank whose thread runs handles the episode once: its flight recorder, then (the lowest) the report.
        self._reported = {r: rec.get("seq") for r, rec in stalled.items()}
        dump_flight_recorder(self.folder, me)
        alive = [r for r, rec in records.items() if rec.get("state") == "running" and now - rec.get("alive", 0) < ALIVE_S]
        if not alive or alive[0] != me:
            return  # the lowest rank whose watchdog runs reports
        path = write_stall_report(self.folder, records, stalled, self.stall_after, me, self.action)
        if self.action == "abort":
            abort(records, stalled, path, me)
