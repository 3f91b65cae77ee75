"""Per-rank heartbeat files: where they live, how a rank writes its own, how any process reads them.

A heartbeat is `rank<N>.json` in a run folder that every rank of a node derives without a collective
(`heartbeat_folder`). It holds the rank's phase, step, the time of its last progress and its pid;
the watchdog thread of every rank reads all of them to find stalled and lost ranks.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytorch_lightning as pl

from leanagent.faults.state import state

log = logging.getLogger("leanagent")

STACK_SIGNAL = signal.SIGUSR2  # SIGUSR1 is Lightning's SLURM requeue signal
FLUSH_S = 1.0  # at most one heartbeat write per second while the phase stays the same


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


def external_launcher() -> bool:
    """torchrun or a multi-task SLURM step started the ranks (not Lightning's own launcher)."""
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
    # No logger (fast_dev_run, logger: false): where Lightning's default logger writes, not the bare working folder.
    return Path(root or Path(trainer.default_root_dir) / "lightning_logs") / "heartbeats" / run_id()


def _rank0_log_dir(trainer: pl.Trainer) -> str | None:
    """Rank 0's log folder without Trainer.log_dir (which broadcasts)."""
    if trainer.global_rank != 0:
        return None
    logger = trainer.loggers[0] if trainer.loggers else None
    try:
        return str(getattr(logger, "log_dir", None) or trainer.default_root_dir)
    except Exception:  # a logger without a usable log_dir
        return str(trainer.default_root_dir)


# This rank's heartbeat.
def write_json(path: Path, record: dict[str, Any]) -> None:
    """Write + rename, so that a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk leaves no empty temporary file behind
        raise


class Heartbeat:
    """This rank's record; SIGUSR2 makes the process dump its Python stacks next to it."""

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
            if changed or now - self._written >= FLUSH_S:
                self._write(now)

    def progress(self) -> None:
        now = time.time()
        with self._lock:
            self.record["calls"] += 1
            self.record["seq"] += 1
            self.record["time"] = now
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
            write_json(self.path, self.record)
            self._written = now
        except OSError as e:  # a full or vanished disk must not stop training
            log.debug("heartbeat write failed: %s", e)

    def mark(self, final_state: str) -> None:
        """A final state before this process exits on purpose, so that no other rank calls it lost."""
        with self._lock:
            self.record["state"] = final_state
            self._write(time.time())

    def close(self, final_state: str) -> None:
        with self._lock:
            self.record["state"] = final_state
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
    process = stat.rsplit(")", 1)[-1].split()[0]
    return {"Z": "zombie", "X": "gone", "T": "stopped", "t": "stopped"}.get(process, "running")


def describe(record: dict[str, Any]) -> str:
    step = record.get("step")
    if step is None:
        step = record.get("calls", 0)  # forward calls in this phase (e.g. corpus batches embedded)
    return f"phase {record.get('phase')}, step {step}"


def duration(seconds: float) -> str:
    return str(timedelta(seconds=int(seconds)))


def current_rank() -> int | None:
    """This process's global rank, from its heartbeat or else the launcher's environment."""
    if state.heartbeat is not None:
        return state.heartbeat.rank
    if state.rank is not None:
        return state.rank
    env = os.environ
    if "RANK" in env:
        return int(env["RANK"])
    if "LOCAL_RANK" in env:
        return int(env["LOCAL_RANK"])
    return None


def claim(folder: Path, name: str) -> bool:
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


def print_line(text: str) -> None:
    """To stderr, never raising: the caller is often about to exit."""
    try:
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
