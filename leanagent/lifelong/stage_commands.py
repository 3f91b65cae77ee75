"""A lifelong stage's command (a `python -m leanagent fit` child process): started in its own process group and
dying with the runner, given the runner's signals, parsed before the first stage trains, and its exit code read
as the run's: refused input, a failure it printed, or a kill it could not print."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from leanagent.errors import LeanAgentError, ReportedError
from leanagent.interrupts import SIGNALS, Interrupted

log = logging.getLogger("leanagent")


RESUME = "run the same command again to continue from where it stopped"
STAGE_ENV = "LEANAGENT_LIFELONG_STAGE"  # set in a stage's environment: the runner speaks for it


def _die_with_parent(parent: int) -> None:
    """In the stage, before exec: be killed when the runner dies (Linux), as a stage in the runner's own
    process group would be by a `kill -9 -PGID` or a closed terminal; otherwise it would run on, orphaned."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # not Linux: the stage outlives a killed runner, as any child would
    if os.getppid() != parent:  # the runner died before prctl took effect
        os._exit(1)


def _own_process_group() -> dict:
    """Popen arguments that start the child in a new process group of the same session (terminal kept),
    dying with this process."""
    parent = os.getpid()
    if sys.version_info >= (3, 11):
        return {"process_group": 0, "preexec_fn": lambda: _die_with_parent(parent)}
    return {"preexec_fn": lambda: (os.setpgrp(), _die_with_parent(parent))}  # Python 3.10


def _stage_env() -> dict[str, str]:
    env = dict(os.environ)
    # Stages import the same leanagent as this process, whatever is installed elsewhere.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    # The stage tells the user nothing about resuming itself: the runner's advice (rerun) is the one that holds.
    env[STAGE_ENV] = "1"
    return env


def check_parses(commands: dict[str, list[str]], cwd: Path) -> dict[str, str]:
    """Parse stage commands without running them (`--print_config` exits after parsing; all at once), so that an
    argument a stage config does not take fails before the first fit rather than after it. Returns each
    command's resolved config."""
    started = {what: subprocess.Popen([*command, "--print_config"], cwd=cwd, env=_stage_env(), text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for what, command in commands.items()}
    try:
        results = {what: (*child.communicate(), child.returncode) for what, child in started.items()}
    finally:  # a signal to the runner alone (SIGTERM) while they parse: they would run on, orphaned
        for child in started.values():
            if child.poll() is None:
                child.kill()
                child.wait()
    for what, (_, stderr, returncode) in results.items():
        if returncode != 0:
            lines = stderr.strip().splitlines() or [f"exit code {returncode}"]
            reason = next((line for line in reversed(lines) if line.startswith("error:")), lines[-1])
            raise LeanAgentError(f"stage_args: the {what} command does not take them: {reason.removeprefix('error:').strip()}")
    return {what: stdout for what, (stdout, _, _) in results.items()}


class StageFailed(ReportedError):
    """A stage's command exited with an error it printed (1: the disk, or a crash's traceback); the run exits
    with the stage's code, not 2, which says the user's input was refused."""

    def __init__(self, what: str, logs: Path, code: int) -> None:
        super().__init__(f"{what} stopped on the error above (exit code {code}; its logs are in {logs})")
        self.what = what
        self.exit_code = code


class StageRefused(StageFailed):
    """A stage's command exited with 2: it refused its input and printed why."""

    def __init__(self, what: str, logs: Path) -> None:
        super().__init__(what, logs, 2)


class StageKilled(LeanAgentError):
    """A stage's command ended by a signal this run did not pass on (the out-of-memory killer's SIGKILL): it
    printed nothing, so this is the one `error:` line."""

    exit_code = 1


def run_stage(command: list[str], cwd: Path, what: str) -> None:
    """Run a stage's command; SIGTERM and SIGINT sent to this process are passed on to it, not left behind."""
    cwd.mkdir(parents=True, exist_ok=True)
    log.info("%s: %s", what, " ".join(command[2:]))
    env = _stage_env()
    # Its own process group: a terminal's Ctrl-C (or a killpg) reaches this process alone, which passes it
    # on once. In the terminal's group the stage would get it twice, and a second Ctrl-C stops a fit at once.
    child = subprocess.Popen(command, cwd=cwd, env=env, **_own_process_group())
    received: list[int] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        if child.poll() is None:
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in SIGNALS}  # what stop_on_signals would otherwise take
    try:
        returncode = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received:
        raise Interrupted(received[0], f"{what} stopped by {signal.Signals(received[0]).name} (exit code {returncode}); {RESUME}")
    if returncode == 2:  # a user error: the stage printed its one `error:` line
        raise StageRefused(what, cwd)
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else f"signal {-returncode}"
        raise StageKilled(f"{what} was killed by {name} (the out-of-memory killer sends SIGKILL); its logs are in {cwd}; "
                          f"{RESUME}")
    if returncode != 0:
        raise StageFailed(what, cwd, returncode)
