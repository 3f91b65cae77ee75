"""Hangs and lost ranks in long DDP runs: per-rank heartbeats, a stall watchdog, one-line fault reports.

LeanAgent keeps a 364-day collective timeout, so a rank that hangs or dies would make the others
wait for a year. This module makes such a job say which rank is stuck and where:

* **Heartbeat.** Every rank writes a small JSON file, `rank<N>.json`, in a run folder that all
  ranks of a node derive without communicating (see `heartbeat_folder`). It holds the rank's
  phase (`data loading barrier`, `train step`, `validation`, `corpus embedding`, `Fisher`,
  `after-fit barrier`, ...), its step, the time of its last progress and its pid. `beat()` is the
  public entry point; the `Watchdog` callback calls it from Lightning hooks, and a forward
  pre-hook on the LightningModule counts each forward call as progress inside a phase. Files are
  replaced atomically (write + rename) at most about once a second; no collective is involved.
* **Watchdog.** A daemon thread in every rank polls once a second. When a rank has made no
  progress for `stall_after`, the lowest rank whose own thread is still alive prints one report
  (first lines: `stalled: rank N (phase P, step S) has made no progress for H:MM:SS`), with the
  Python stack of every rank on its host (`faulthandler`, triggered by SIGUSR2), and writes it to
  `stall-report.txt` in rank 0's log folder. Each rank also dumps PyTorch's flight recorder (its
  last collectives, gloo or NCCL) next to its heartbeat, and the report says which collective each
  rank entered last. With `action="abort"` the reporter then kills the ranks on its host and exits
  with `EXIT_STALLED`.
* **Lost ranks.** A rank killed from outside is named once (`error: rank N ... was lost ...`) by
  whichever process notices first: the launcher's child observer (`_RankObserver`, replacing
  Lightning's), a survivor whose collective failed (`leanagent.cli.main`), or a watchdog thread
  that finds the pid gone. Survivors print one `error (rank N): ...` line and exit with
  `EXIT_RANK_LOST`; a rank whose parent (the launcher) disappeared exits too.

The watchdog sees the ranks whose heartbeat files it can read: all ranks of its own node, and
those of other nodes only when the run folder is on a filesystem they share.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback

log = logging.getLogger("leanagent")

EXIT_STALLED = 3  # action=abort after a stall report
EXIT_RANK_LOST = 4  # a rank died or a collective failed because one did
STACK_SIGNAL = signal.SIGUSR2  # SIGUSR1 is Lightning's SLURM requeue signal
POLL_S = 1.0  # the watchdog thread's period
FLUSH_S = 1.0  # at most one heartbeat write per second while the phase stays the same
ALIVE_S = 6.0  # a rank whose thread has not written for this long cannot report (stopped or frozen)
STACK_WAIT_S = 3.0  # how long the reporter waits for the other ranks' stack dumps
# Exit codes of a rank that stopped on SIGTERM or Ctrl-C once the ranks had agreed and rank 0 had saved
# (128 + signal, leanagent.cli.main): a stop on purpose, not a lost rank.
PREEMPTED_CODES = (128 + signal.SIGTERM, 128 + signal.SIGINT)
LOST_GRACE_S = 10.0  # after a lost rank, how long survivors get to exit on their own before being killed

_current: _Heartbeat | None = None  # this process's heartbeat while a Watchdog runs
_last_folder: Path | None = None  # kept after the watchdog stops, for the error path in leanagent.cli.main
_last_rank: int | None = None
_ending = threading.Event()  # set once this process decided to end the job (abort or lost rank)
_aborting = threading.Event()  # set by a watchdog abort: the observer then names no lost rank


def beat(phase: str, step: Any = None, trainer: pl.Trainer | None = None) -> None:
    """Record that this rank entered `phase` (at `step`). Cheap; a no-op when no Watchdog runs.

    With `trainer`, starts that trainer's Watchdog callback if it has not started yet (the data
    loading barrier runs before the Watchdog's own `setup` hook).
    """
    heartbeat = _current
    if heartbeat is None and trainer is not None:
        watchdog = next((c for c in trainer.callbacks if isinstance(c, Watchdog)), None)
        if watchdog is not None:
            watchdog.start(trainer)
            heartbeat = _current
    if heartbeat is not None:
        heartbeat.beat(phase, step)


def progress() -> None:
    """Progress inside the current phase (called on every forward of the LightningModule)."""
    heartbeat = _current
    if heartbeat is not None:
        heartbeat.progress()


# Where the heartbeats live.
def run_id() -> str:
    """An id that every rank of a node derives without communication.

    `LEANAGENT_RUN_ID` when set (Lightning's launcher passes it on to the ranks it spawns, see
    `Watchdog.__init__`); under torchrun its run id, rendezvous port and restart count; under a
    SLURM step that launched the ranks, the job and step ids.
    """
    env = os.environ
    if env.get("LEANAGENT_RUN_ID"):
        return env["LEANAGENT_RUN_ID"]
    if "TORCHELASTIC_RUN_ID" in env:
        return f"torchrun-{env['TORCHELASTIC_RUN_ID']}-{env.get('MASTER_PORT', '0')}-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if env.get("SLURM_JOB_ID"):
        return f"slurm-{env['SLURM_JOB_ID']}-{env.get('SLURM_STEP_ID', '0')}"
    return f"pid-{os.getppid() if env.get('LOCAL_RANK', '0') != '0' else os.getpid()}"


def _external_launcher() -> bool:
    env = os.environ
    return "TORCHELASTIC_RUN_ID" in env or int(env.get("SLURM_NTASKS", "1") or 1) > 1


def heartbeat_folder(trainer: pl.Trainer) -> Path:
    """`$LEANAGENT_HEARTBEAT_DIR`, else `<logger root>/heartbeats/<run id>` (e.g. lightning_logs/retrieval/heartbeats/...).

    The logger's root (save_dir/name) rather than its version folder: ranks other than 0 cannot
    know the version without a collective.
    """
    if os.environ.get("LEANAGENT_HEARTBEAT_DIR"):
        return Path(os.environ["LEANAGENT_HEARTBEAT_DIR"])
    logger = trainer.loggers[0] if trainer.loggers else None
    root = getattr(logger, "root_dir", None) if logger is not None else None
    return Path(root or trainer.default_root_dir) / "heartbeats" / run_id()


def _rank0_log_dir(trainer: pl.Trainer) -> str | None:
    """Rank 0's log folder without Trainer.log_dir (which broadcasts)."""
    if trainer.global_rank != 0:
        return None
    logger = trainer.loggers[0] if trainer.loggers else None
    try:
        return str(getattr(logger, "log_dir", None) or trainer.default_root_dir)
    except Exception:  # a logger without a usable log_dir
        return str(trainer.default_root_dir)


# Per-rank heartbeat.
def _write_json(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


class _Heartbeat:
    def __init__(self, folder: Path, trainer: pl.Trainer, stack_signal: int = STACK_SIGNAL) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.rank = trainer.global_rank
        self.path = folder / f"rank{self.rank}.json"
        self.stack_path = folder / f"stack-rank{self.rank}.txt"
        self._stack_file = open(self.stack_path, "w")
        self._stack_signal = stack_signal
        faulthandler.register(stack_signal, file=self._stack_file, all_threads=True, chain=False)
        now = time.time()
        self.record: dict[str, Any] = {
            "rank": self.rank,
            "world_size": trainer.world_size,
            "local_rank": trainer.local_rank,
            "node_rank": trainer.node_rank,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "phase": "starting",
            "step": None,
            "calls": 0,
            "seq": 0,
            "time": now,
            "phase_since": now,
            "alive": now,
            "state": "running",
            "stacks": True,  # SIGUSR2 dumps this rank's stacks to stack_file
            "stack_file": self.stack_path.name,
            "log_dir": _rank0_log_dir(trainer),
        }
        self._lock = threading.Lock()
        self._written = 0.0
        self._dirty = True
        self.flush()

    def beat(self, phase: str, step: Any = None) -> None:
        now = time.time()
        with self._lock:
            record = self.record
            changed = phase != record["phase"]
            if changed:
                record["phase"], record["phase_since"], record["calls"] = phase, now, 0
            record["step"] = step
            record["seq"] += 1
            record["time"] = now
            self._dirty = True
            if changed or now - self._written >= FLUSH_S:
                self._write(now)

    def progress(self) -> None:
        now = time.time()
        with self._lock:
            self.record["calls"] += 1
            self.record["seq"] += 1
            self.record["time"] = now
            self._dirty = True
            if now - self._written >= FLUSH_S:
                self._write(now)

    def flush(self, alive: bool = True) -> None:
        now = time.time()
        with self._lock:
            if alive:
                self.record["alive"] = now
            self._write(now)

    def _write(self, now: float) -> None:
        try:
            _write_json(self.path, self.record)
            self._written = now
            self._dirty = False
        except OSError as e:  # a full or vanished disk must not stop training
            log.debug("heartbeat write failed: %s", e)

    def mark(self, state: str) -> None:
        """A final state before this process exits on purpose, so that no other rank calls it lost."""
        with self._lock:
            self.record["state"] = state
            self._write(time.time())

    def close(self, state: str) -> None:
        with self._lock:
            self.record["state"] = state
            self.record["stacks"] = False
            self._write(time.time())
        faulthandler.unregister(self._stack_signal)
        self._stack_file.close()
        if self.stack_path.stat().st_size == 0:
            self.stack_path.unlink(missing_ok=True)


# Reading heartbeats.
def read_heartbeats(folder: Path) -> dict[int, dict[str, Any]]:
    records = {}
    for path in folder.glob("rank*.json"):
        try:
            record = json.loads(path.read_text())
            records[int(record["rank"])] = record
        except (OSError, ValueError, KeyError):
            continue  # being replaced, or not ours
    return dict(sorted(records.items()))


def process_state(record: dict[str, Any]) -> str | None:
    """'gone', 'zombie', 'stopped', 'running' for a process on this host; None for another host."""
    if record.get("host") != socket.gethostname():
        return None
    try:
        stat = Path(f"/proc/{int(record['pid'])}/stat").read_text()
    except (OSError, ValueError):
        return "gone"
    state = stat.rsplit(")", 1)[-1].split()[0]
    return {"Z": "zombie", "X": "gone", "T": "stopped", "t": "stopped"}.get(state, "running")


def describe(record: dict[str, Any]) -> str:
    step = record.get("step")
    if step is None:
        step = record.get("calls", 0)  # forward calls in this phase (e.g. corpus batches embedded)
    return f"phase {record.get('phase')}, step {step}"


def _duration(seconds: float) -> str:
    return str(timedelta(seconds=int(seconds)))


def _claim(folder: Path, name: str) -> bool:
    """True for exactly one caller per `name` among processes sharing `folder`."""
    try:
        fd = os.open(folder / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    except OSError:
        return True  # no folder to agree in: say it anyway
    os.write(fd, f"{os.getpid()}\n".encode())
    os.close(fd)
    return True


def _print(text: str) -> None:
    try:
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


# Lost ranks.
def lost_ranks(folder: Path | None, exclude: int | None = None) -> list[tuple[int, dict[str, Any], str]]:
    """Ranks on this host whose heartbeat says running but whose process is gone (or a zombie)."""
    if folder is None or not folder.is_dir():
        return []
    lost = []
    for rank, record in read_heartbeats(folder).items():
        if rank == exclude or record.get("state") != "running":
            continue
        state = process_state(record)
        if state in ("gone", "zombie"):
            lost.append((rank, record, "its process is gone"))
    return lost


def lost_rank_line(rank: int, record: dict[str, Any] | None, how: str) -> str:
    where = ""
    if record:
        where = f"; its last known {describe(record)} ({_duration(time.time() - record.get('time', time.time()))} before)"
    pid = f" (pid {record['pid']})" if record else ""
    return f"error: rank {rank}{pid} was lost: {how}{where}; stopping the other ranks"


def report_lost(folder: Path | None, rank: int, record: dict[str, Any] | None, how: str) -> bool:
    """Print the one `error:` line for a lost rank; False if another process already did."""
    if folder is not None and folder.is_dir() and not _claim(folder, f"lost-rank{rank}.claim"):
        return False
    _print(lost_rank_line(rank, record, how))
    return True


def report_lost_ranks(folder: Path | None = None, exclude: int | None = None, wait_s: float = 3.0) -> bool:
    """Name the ranks of this host that died (waiting up to `wait_s` for them to show as gone)."""
    folder = folder or _last_folder
    deadline = time.time() + wait_s
    while True:
        found = lost_ranks(folder, exclude)
        if found or time.time() >= deadline:
            break
        time.sleep(0.2)
    for rank, record, how in found:
        report_lost(folder, rank, record, how)
    return bool(found)


def current_rank() -> int | None:
    if _current is not None:
        return _current.rank
    if _last_rank is not None:
        return _last_rank
    env = os.environ
    if "RANK" in env:
        return int(env["RANK"])
    if "LOCAL_RANK" in env:
        return int(env["LOCAL_RANK"])
    return None


COLLECTIVE_ERROR_MARKERS = (
    "Connection reset by peer", "Connection closed by peer", "Broken pipe", "[gloo", "gloo/",
    "NCCL error", "NCCL communicator", "ProcessGroupNCCL", "ProcessGroupGloo", "DistBackendError", "Socket Timeout",
)


def collective_error(error: BaseException | None) -> BaseException | None:
    """The distributed-communication error in `error`'s chain, if any."""
    seen = set()
    try:
        from torch.distributed import DistError
    except ImportError:  # pragma: no cover
        DistError = ()  # type: ignore[assignment]
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


def _parent_rank() -> int | None:
    """The rank of this process's parent if it is a rank (Lightning's rank 0 for the ranks it spawned)."""
    folder = _last_folder
    if folder is None or not folder.is_dir():
        return None
    records = read_heartbeats(folder)
    mine = records.get(_last_rank) if _last_rank is not None else None
    parent = mine.get("ppid") if mine else os.getppid()  # recorded at start: the launcher may be gone by now
    return next((r for r, rec in records.items() if rec.get("pid") == parent), None)


def _wait_for_claims(folder: Path | None, exclude: set, wait_s: float) -> None:
    """Wait until every lost rank of this host (but `exclude`) was named by someone, or `wait_s` passed."""
    deadline = time.time() + wait_s
    while folder is not None and time.time() < deadline:
        lost = [r for r, _, _ in lost_ranks(folder) if r not in exclude]
        if lost and all((folder / f"lost-rank{r}.claim").exists() for r in lost):
            return
        time.sleep(0.1)


def handle_collective_error(error: BaseException) -> int:
    """A survivor's end: name the lost rank (once per job), one line for this rank, the exit code."""
    rank = current_rank()
    _ending.set()
    named = False
    if _observer is not None:  # Lightning's launcher: the observer names the child with its exit signal
        deadline = time.time() + 3.0
        while not _observer.named and time.time() < deadline:
            time.sleep(0.1)
        named = _observer.named
    elif os.environ.get("LOCAL_RANK", "0") != "0" and not _external_launcher():
        # A rank spawned by Lightning: rank 0's observer knows how a child died (its exit signal); give it a moment.
        _wait_for_claims(_last_folder, exclude={rank, _parent_rank()}, wait_s=2.5)
    named = report_lost_ranks(exclude=rank) or named
    if not named:
        _print("error: a collective failed because another rank stopped communicating (it died or its node "
               "is unreachable); no lost rank was found on this host")
    _print(f"error (rank {rank if rank is not None else '?'}): collective failed: {one_line(error)}")
    _stop_children(LOST_GRACE_S / 2)
    return EXIT_RANK_LOST


# Lightning's child observer, kept but made to name the rank and give survivors time to say why they stop.
_observer: Any = None  # the running _RankObserver (built lazily: it subclasses a private Lightning class)


def _stop_children(grace_s: float) -> None:
    """In Lightning's launcher (rank 0): let the spawned ranks exit on their own, then kill them."""
    observer = _observer
    if observer is None:
        return
    deadline = time.time() + grace_s
    procs = observer._child_processes
    while time.time() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.kill()


def _make_observer_class():
    from lightning_fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    class _RankObserver(_ChildProcessObserver):
        """Polls every second; a child that exits non-zero is named, survivors get time to print one line."""

        def __init__(self, main_pid: int, child_processes: list, sleep_period: int = 1) -> None:
            super().__init__(main_pid=main_pid, child_processes=child_processes, sleep_period=POLL_S)
            self.named = False
            self.reason = "another rank ended early"

        def _run(self) -> bool:
            for proc in self._child_processes:
                proc.poll()
            codes = [proc.returncode for proc in self._child_processes]
            if all(code == 0 or code in PREEMPTED_CODES for code in codes):
                # Every child finished, or stopped on a signal after rank 0's checkpoint (exit 128 + signal,
                # callbacks/preemption.py): rank 0 ends the same way on its own and says so itself.
                return True
            failed = [(i + 1, p) for i, p in enumerate(self._child_processes) if p.returncode and p.returncode not in PREEMPTED_CODES]
            if not failed:
                return False
            self.reason = f"rank {self._global_rank(failed[0][0])} ended early"
            if not _aborting.is_set():
                _ending.set()
                folder = _last_folder
                records = read_heartbeats(folder) if folder is not None and folder.is_dir() else {}
                for local_rank, proc in failed:
                    rank = self._global_rank(local_rank)
                    code = proc.returncode
                    if code < 0:
                        how = f"killed by {signal.Signals(-code).name}"
                    else:
                        how = f"exited with code {code}"
                    if code not in (2, EXIT_STALLED, EXIT_RANK_LOST):  # those print their own error line
                        report_lost(folder, rank, records.get(rank), how)
                        self.named = True
            self._terminate_all()
            return True

        def _global_rank(self, local_rank: int) -> int:
            procs_per_node = len(self._child_processes) + 1
            return int(os.environ.get("NODE_RANK", "0") or 0) * procs_per_node + local_rank

        def _terminate_all(self) -> None:
            # Survivors usually fail in their next collective within a second and print one line each;
            # a rank blocked for good (NCCL, a hung step) is killed after the grace period.
            deadline = time.time() + LOST_GRACE_S
            while time.time() < deadline:
                if all(p.poll() is not None for p in self._child_processes):
                    break
                time.sleep(0.2)
            for p in self._child_processes:
                if p.poll() is None:
                    p.kill()
            time.sleep(LOST_GRACE_S / 2)  # the main thread normally exits (EXIT_RANK_LOST) before this
            _print(f"error (rank 0): stopped because {self.reason}")
            os._exit(EXIT_RANK_LOST)

    return _RankObserver


def install_fault_handling() -> None:
    """Replace Lightning's child-process observer by `_RankObserver`. Idempotent; call before fit."""
    from pytorch_lightning.strategies.launchers import subprocess_script as pl_launcher

    if getattr(pl_launcher._launch_process_observer, "_leanagent", False):
        return
    observer_class = _make_observer_class()

    def _launch_process_observer(child_processes: list) -> None:
        global _observer
        _observer = observer_class(main_pid=os.getpid(), child_processes=child_processes)
        _observer.start()

    _launch_process_observer._leanagent = True  # type: ignore[attr-defined]
    pl_launcher._launch_process_observer = _launch_process_observer


def set_flight_recorder_env() -> dict[str, str]:
    """PyTorch's NCCL flight recorder and dump-on-timeout, where the user has not set them.

    torch 2.13 reads: TORCH_FR_BUFFER_SIZE (or the older TORCH_NCCL_TRACE_BUFFER_SIZE) for the
    number of recorded collectives (0, the default, disables the recorder), TORCH_NCCL_DUMP_ON_TIMEOUT
    to dump it when a collective times out (needs TORCH_NCCL_ENABLE_MONITORING, on by default),
    and TORCH_FR_DUMP_TEMP_FILE (or TORCH_NCCL_DEBUG_INFO_TEMP_FILE) as the dump files' prefix,
    set by the Watchdog to the heartbeat folder. With the 364-day timeout NCCL's own dump-on-timeout
    practically never fires; the recorder itself (which torch 2.13 also keeps for gloo) is what the
    watchdog dumps on a stall (`dump_flight_recorder`).
    """
    changed = {}
    env = os.environ
    if "TORCH_FR_BUFFER_SIZE" not in env and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env:
        changed["TORCH_FR_BUFFER_SIZE"] = "2000"
    if "TORCH_NCCL_DUMP_ON_TIMEOUT" not in env:
        changed["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
    env.update(changed)
    return changed


# The watchdog.
class Watchdog(Callback):
    """Reports ranks that make no progress for `stall_after`; on by default in both configs.

    Args:
        stall_after: how long a rank may go without progress before the report (e.g. `0:30:00`).
        action: `report` logs the report and lets the job wait; `abort` then ends the job with
            exit code 3 so that a scheduler can restart it.
    """

    def __init__(self, stall_after: timedelta = timedelta(minutes=30), action: Literal["report", "abort"] = "report") -> None:
        from leanagent.errors import LeanAgentError

        if isinstance(stall_after, (int, float)):
            stall_after = timedelta(seconds=stall_after)
        if not isinstance(stall_after, timedelta) or stall_after.total_seconds() <= 0:
            raise LeanAgentError(f"watchdog.stall_after must be a positive duration like '0:30:00', got {stall_after!r}")
        if action not in ("report", "abort"):
            raise LeanAgentError(f"watchdog.action must be 'report' or 'abort', got {action!r}")
        self.stall_after = stall_after
        self.action = action
        self._thread: _WatchThread | None = None
        self._hook = None
        # Lightning's launcher spawns ranks 1..N-1 during fit; they inherit this and share the run folder.
        if not _external_launcher() and os.environ.get("LOCAL_RANK", "0") == "0":
            os.environ["LEANAGENT_RUN_ID"] = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"

    def start(self, trainer: pl.Trainer) -> None:
        global _current, _last_folder, _last_rank
        if _current is not None:
            return
        folder = heartbeat_folder(trainer)
        try:
            heartbeat = _Heartbeat(folder, trainer)
        except OSError as e:
            log.warning("watchdog off: cannot write heartbeats in %s (%s)", folder, e)
            return
        _current, _last_folder, _last_rank = heartbeat, folder, heartbeat.rank
        _ending.clear()
        if "TORCH_FR_DUMP_TEMP_FILE" not in os.environ and "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in os.environ:
            os.environ["TORCH_FR_DUMP_TEMP_FILE"] = str(folder.resolve() / "flight-recorder-rank")
        module = trainer.lightning_module
        if module is not None:
            self._hook = module.register_forward_pre_hook(lambda *_: progress())
        self._thread = _WatchThread(heartbeat, self.stall_after, self.action)
        self._thread.start()
        if trainer.global_rank == 0:
            log.info("watchdog: heartbeats in %s, report after %s without progress (action: %s)",
                     folder, self.stall_after, self.action)

    def stop(self, state: str = "finished") -> None:
        global _current
        heartbeat = _current
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if heartbeat is not None:
            _current = None
            heartbeat.close(state)

    # Phases.
    def setup(self, trainer, pl_module, stage) -> None:
        self.start(trainer)
        beat("data loading", trainer=trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        beat("train step", f"{batch_idx} of epoch {trainer.current_epoch}")

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        beat("train step (backward)", _keep_step())

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        beat("train step (optimizer)", _keep_step())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        beat("after train step", f"{batch_idx} of epoch {trainer.current_epoch}")

    def on_validation_start(self, trainer, pl_module) -> None:
        beat("validation")

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        beat("validation", batch_idx)

    def on_validation_end(self, trainer, pl_module) -> None:
        beat("after validation")

    def on_test_start(self, trainer, pl_module) -> None:
        beat("test")

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        beat("test", batch_idx)

    def on_predict_start(self, trainer, pl_module) -> None:
        beat("predict")

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        beat("predict", batch_idx)

    def on_train_end(self, trainer, pl_module) -> None:
        beat("after training")

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.stop("failed")

    def teardown(self, trainer, pl_module, stage) -> None:
        self.stop("finished")


def _keep_step() -> Any:
    heartbeat = _current
    return heartbeat.record.get("step") if heartbeat is not None else None


class _WatchThread(threading.Thread):
    def __init__(self, heartbeat: _Heartbeat, stall_after: timedelta, action: str) -> None:
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
        if not self._launched or os.getppid() == self._ppid or _ending.is_set():
            return False
        _ending.set()
        time.sleep(2.0)  # the main thread usually fails in a collective meanwhile and prints its own line
        if self._stop_event.is_set():
            return True  # this rank finished normally meanwhile
        self.heartbeat.mark("exited: launcher gone")
        report_lost_ranks(self.folder, exclude=self.heartbeat.rank, wait_s=0)
        _print(f"error (rank {self.heartbeat.rank}): the process that launched this rank (pid {self._ppid}) is gone; exiting")
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
        if not _ending.is_set():
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


def _dump_stacks(folder: Path, records: dict[int, dict[str, Any]], me: int) -> dict[int, str]:
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
        state = process_state(record)
        if state is None:
            stacks[rank] = f"not available: rank {rank} runs on host {record.get('host')}"
        elif state in ("gone", "zombie"):
            stacks[rank] = "not available: the process is gone"
        elif not record.get("stacks") or record.get("state") != "running":
            stacks[rank] = f"not available: the rank is {record.get('state')}"
        else:
            try:
                os.kill(int(record["pid"]), STACK_SIGNAL)
            except OSError as e:
                stacks[rank] = f"not available: {e}"
                continue
            if state == "stopped":
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
                with open(path, errors="replace") as f:
                    f.seek(sizes[rank])
                    stacks[rank] = f.read().rstrip()
            last[rank] = size
    for rank, path in pending.items():
        size = path.stat().st_size if path.exists() else 0
        if size > sizes[rank]:
            with open(path, errors="replace") as f:
                f.seek(sizes[rank])
                stacks[rank] = f.read().rstrip()
        else:
            stacks[rank] = f"not available: no dump within {STACK_WAIT_S:.0f} s"
    return stacks


def dump_flight_recorder(folder: Path, rank: int) -> Path | None:
    """This rank's PyTorch flight recorder (its last collectives; gloo and NCCL), as JSON in the heartbeat folder.

    Needs TORCH_FR_BUFFER_SIZE > 0 before the process group exists (`set_flight_recorder_env`).
    """
    try:
        import torch.distributed as dist
        from torch._C._distributed_c10d import _dump_fr_trace_json

        if not (dist.is_available() and dist.is_initialized()):
            return None
        path = folder / f"flight-recorder-rank{rank}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(_dump_fr_trace_json(includeCollectives=True, onlyActive=False))
        os.replace(tmp, path)
        return path
    except Exception as e:  # an older torch, or a recorder that is off
        log.debug("flight recorder dump failed: %s", e)
        return None


def last_collective(path: Path) -> dict[str, Any] | None:
    try:
        entries = json.loads(path.read_text()).get("entries") or []
    except (OSError, ValueError, AttributeError):
        return None
    return max(entries, key=lambda e: e.get("collective_seq_id", 0)) if entries else None


def flight_recorder_summary(path: Path) -> str | None:
    """`last collective #57 gloo:all_reduce (scheduled, created 3.2 s ago; ...)` from `dump_flight_recorder`'s file."""
    last = last_collective(path)
    if last is None:
        return None
    created = last.get("time_created_ns") or 0
    ago = f", created {time.time() - created / 1e9:.1f} s ago" if created else ""
    return (f"last collective #{last.get('collective_seq_id')} {last.get('profiling_name')} "
            f"({last.get('state')}{ago}; flight recorder in {path.name})")


def stall_lines(records, stalled, now: float, collectives: dict[int, int] | None = None) -> list[str]:
    """The grep-able first lines: `stalled: rank N (phase P, step S) has made no progress for D`.

    The likely cause first: the rank that entered the fewest collectives (when every stalled rank's
    flight recorder says), else the rank idle the longest.
    """
    collectives = collectives or {}
    by_collective = all(r in collectives for r in stalled)
    order = sorted(stalled, key=lambda r: (collectives[r] if by_collective else 0, stalled[r].get("time", now), r))
    return [
        f"stalled: rank {r} ({describe(stalled[r])}) has made no progress for {_duration(now - stalled[r].get('time', now))}"
        for r in order
    ]


def format_stall_report(records, stalled, stall_after: float, me: int, stacks: dict[int, str], now: float, folder: Path | None = None) -> str:
    collectives = {}
    for rank in records:
        last = last_collective(folder / f"flight-recorder-rank{rank}.json") if folder is not None else None
        if last is not None and last.get("collective_seq_id") is not None:
            collectives[rank] = int(last["collective_seq_id"])
    lines = stall_lines(records, stalled, now, collectives)
    world = next(iter(records.values())).get("world_size", len(records)) if records else 0
    lines.append(
        f"watchdog: {len(stalled)} of {world} rank(s) made no progress for more than {_duration(stall_after)} "
        f"(report by rank {me} at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now))})"
    )
    for rank in range(world):
        record = records.get(rank)
        if record is None:
            lines.append(f"  rank {rank}: no heartbeat here (on another node without a shared folder, or not started)")
            continue
        state = process_state(record)
        lines.append(
            f"  rank {rank}: {describe(record)}, last progress {now - record.get('time', now):.1f} s ago, "
            f"in this phase for {now - record.get('phase_since', now):.1f} s, pid {record.get('pid')} on {record.get('host')}"
            f", {record.get('state')}" + (f", process {state}" if state else "")
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


def write_stall_report(folder: Path, records, stalled, stall_after: float, me: int, action: str) -> Path:
    stacks = _dump_stacks(folder, records, me)
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
    _print(text + f"watchdog: report written to {path}" + ("" if action == "abort" else "; the job keeps waiting (watchdog.action=report)"))
    return path


def abort(records, stalled, path: Path, me: int) -> None:
    """End the job: kill the other ranks on this host, exit with EXIT_STALLED."""
    _aborting.set()
    _ending.set()
    if _current is not None:
        _current.mark("exited: watchdog abort")
    now = time.time()
    first = min(stalled, key=lambda r: (stalled[r].get("time", now), r))
    record = stalled[first]
    _print(
        f"error: watchdog: rank {first} made no progress for {_duration(now - record.get('time', now))} "
        f"({describe(record)}); aborting the job (watchdog.action=abort, report in {path})"
    )
    for rank, rec in records.items():
        if rank != me and process_state(rec) not in (None, "gone"):
            try:
                os.kill(int(rec["pid"]), signal.SIGKILL)
            except OSError:
                pass
    os._exit(EXIT_STALLED)
