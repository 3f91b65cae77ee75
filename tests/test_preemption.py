"""SIGTERM and Ctrl-C during a real 2-rank fit: a resumable checkpoint, a non-zero exit, and an exact resume."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, run_cli, small_fit_args
from tests.helpers import signal_when_ready

pytestmark = pytest.mark.slow  # real subprocesses

RETRIEVAL = str(REPO / "configs" / "retrieval.yaml")


def fit_args(dataset: Path, num_workers: int = 0) -> list[str]:
    return small_fit_args(dataset, 2, num_workers)  # what `trained_run` ran, so that it is the uninterrupted fit


def final_state(workdir: Path) -> tuple[dict, float]:
    checkpoint = torch.load(workdir / "checkpoints" / "retrieval" / "last.ckpt", weights_only=True)
    metrics = (max(workdir.glob("lightning_logs/retrieval/version_*"), key=lambda p: int(p.name[8:])) / "metrics.csv").read_text()
    header, *rows = metrics.splitlines()
    column = header.split(",").index("Recall@10_val")
    recall = [float(r.split(",")[column]) for r in rows if r.split(",")[column]][-1]
    return checkpoint, recall


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("signal_name, code", [("SIGTERM", 143)])
def test_a_fit_stopped_mid_epoch_and_resumed_equals_an_uninterrupted_fit(tmp_path, mini_dataset, trained_run, signal_name, code, num_workers):
    # Worker processes draw their first indices when the loader's iterator is made (before Lightning sets
    # the epoch of a resumed fit): with 2 workers the resumed epoch must still skip what was trained.
    expected, expected_recall = final_state(trained_run[0])  # the same command, uninterrupted
    steps_per_epoch = expected["global_step"] // 2
    assert steps_per_epoch >= 3

    stopped = tmp_path / "stopped"
    stopped.mkdir()
    stop_at = steps_per_epoch + steps_per_epoch // 2  # the middle of epoch 1
    result = run_cli([*fit_args(mini_dataset, num_workers), "--trainer.callbacks+=tests.helpers.SignalAtStep",
                      f"--trainer.callbacks.step={stop_at}", f"--trainer.callbacks.signal_name={signal_name}"], cwd=stopped)
    assert result.returncode == code, result.stderr[-3000:]
    (line,) = [l for l in result.stderr.splitlines() if l.startswith("preempted:")]
    assert f"stopped by {signal_name}" in line and "--ckpt_path=" in line
    assert "Traceback" not in result.stderr
    partial = torch.load(stopped / "checkpoints" / "retrieval" / "last.ckpt", weights_only=True)
    assert partial["epoch"] == 1 and partial["global_step"] == stop_at + 1  # the step under way when it came
    assert partial["leanagent_fit"]["finished"] is False

    ckpt_path = re.search(r"--ckpt_path=(\S+)", line).group(1)
    resumed = run_cli([*fit_args(mini_dataset, num_workers), f"--ckpt_path={ckpt_path}"], cwd=stopped)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "this fit trains to max_epochs=2" in resumed.stderr  # the interrupted plan, not 2 more epochs
    final, recall = final_state(stopped)
    assert final["global_step"] == expected["global_step"]
    for name, tensor in expected["state_dict"].items():
        torch.testing.assert_close(final["state_dict"][name], tensor, rtol=0, atol=1e-6)
    assert recall == pytest.approx(expected_recall, abs=1e-6)


def _heartbeat_step(folder: Path) -> tuple[str, int, int] | None:
    """Rank 0's (phase, batch, epoch) from its heartbeat file, once it is in a training step."""
    try:
        record = json.loads((folder / "rank0.json").read_text())
    except (OSError, ValueError):
        return None
    found = re.match(r"(\d+) of epoch (\d+)", str(record.get("step")))
    return (record["phase"], int(found.group(1)), int(found.group(2))) if found else None


def launch_env(**extra: str) -> dict[str, str]:
    """This environment for `main.py` started as a user would: the repository importable, and no rank variables
    of a launcher around pytest."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_"))}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def ctrl_c_when_training(args: list[str], cwd: Path, after_batch: int = 0, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `main.py args` in a session of its own and press Ctrl-C as a terminal does: SIGINT to the whole
    process group (every rank and worker), once rank 0 has finished training batch `after_batch`."""
    heartbeats = cwd / "heartbeats"
    env = launch_env(LEANAGENT_HEARTBEAT_DIR=str(heartbeats))
    with open(cwd / "stderr.txt", "w") as err:
        process = subprocess.Popen([sys.executable, str(REPO / "main.py"), *args], cwd=cwd, env=env,
                                   stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        deadline = time.time() + timeout
        while process.poll() is None and time.time() < deadline:
            step = _heartbeat_step(heartbeats)
            # Past a whole step on rank 0: every rank has joined its gradient all-reduce, so all handle signals.
            if step is not None and (step[1] > after_batch or step[0] == "after train step" and step[1] >= after_batch):
                os.killpg(process.pid, signal.SIGINT)
                break
            time.sleep(0.05)
        try:
            process.wait(timeout=max(1.0, deadline - time.time()))
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(process.args, process.returncode, "", (cwd / "stderr.txt").read_text())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, mini_dataset, trained_run):
    """The final state of an uninterrupted fit per number of ranks (workers do not change it)."""
    runs: dict[int, tuple[dict, float]] = {2: final_state(trained_run[0])}

    def get(devices: int) -> tuple[dict, float]:
        if devices not in runs:
            folder = tmp_path_factory.mktemp(f"straight{devices}")
            result = run_cli([*fit_args(mini_dataset), f"--trainer.devices={devices}"], cwd=folder)
            assert result.returncode == 0, result.stderr[-3000:]
            runs[devices] = final_state(folder)
        return runs[devices]

    return get


# Two ranks prove that every rank takes the Ctrl-C as one request; with workers, that every worker does too.
@pytest.mark.parametrize("devices, num_workers", [(2, 0), (2, 2)])
def test_ctrl_c_to_the_process_group_saves_and_the_same_command_finishes_the_fit(
    tmp_path, mini_dataset, uninterrupted, devices, num_workers
):
    """A terminal's Ctrl-C reaches every rank and every worker at once: each must take it as one request
    to stop (not a second, 'stop now' Ctrl-C), rank 0 saves last.ckpt, the job exits 130, nobody is lost."""
    args = [*fit_args(mini_dataset, num_workers), f"--trainer.devices={devices}"]
    stopped = ctrl_c_when_training(args, tmp_path)
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    lines = stopped.stderr.splitlines()
    (line,) = [l for l in lines if l.startswith("preempted:")]
    assert "stopped by SIGINT" in line and "--ckpt_path=" in line
    assert not [l for l in lines if "lost" in l or l.startswith("error")], stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and "KeyboardInterrupt" not in stopped.stderr
    assert torch.load(tmp_path / "checkpoints" / "retrieval" / "last.ckpt", weights_only=True)["leanagent_fit"]["finished"] is False

    ckpt_path = re.search(r"--ckpt_path=(\S+)", line).group(1)
    resumed = run_cli([*args, f"--ckpt_path={ckpt_path}"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected, expected_recall = uninterrupted(devices)
    final, recall = final_state(tmp_path)
    assert final["global_step"] == expected["global_step"]
    for name, tensor in expected["state_dict"].items():
        torch.testing.assert_close(final["state_dict"][name], tensor, rtol=0, atol=1e-6)
    assert recall == pytest.approx(expected_recall, abs=1e-6)


@pytest.mark.parametrize("subcommand, signal_name, to_group", [("validate", "SIGTERM", False), ("test", "SIGINT", True)])
def test_a_signal_during_validate_or_test_exits_non_zero_with_one_line(tmp_path, mini_dataset, trained_run,
                                                                       subcommand, signal_name, to_group):
    """Outside a fit's training steps Lightning turns SIGTERM into SystemExit(None), exit 0 in silence, and
    Ctrl-C into a bare exit 1: a preempted evaluation must not look finished."""
    folder, _ = trained_run
    ready = tmp_path / "evaluating"
    args = ["--config", RETRIEVAL, "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.precision=32-true",
            f"--data.data_path={mini_dataset / 'random'}", f"--data.corpus_path={mini_dataset / 'corpus.jsonl'}",
            "--data.max_seq_len=64", "--trainer.callbacks+=tests.helpers.PauseInEvaluation",
            f"--trainer.callbacks.ready={ready}", f"--ckpt_path={folder / 'checkpoints' / 'retrieval' / 'last.ckpt'}"]
    returncode, stderr = signal_when_ready([sys.executable, str(REPO / "main.py"), subcommand, *args], tmp_path, ready,
                                           signal_name, to_group, wait=300)
    assert returncode == 128 + signal.Signals[signal_name], stderr[-3000:]
    errors = [l for l in stderr.splitlines() if l.startswith("error")]
    assert errors == [f"error: {subcommand} stopped by {signal_name}; run the same command again"], stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr


def test_sigterm_to_every_rank_while_one_waits_in_a_collective_ends_the_evaluation(tmp_path, mini_dataset, trained_run):
    """Lightning's SIGTERM handler runs a broadcast from rank 0 inside the handler. A rank whose handler runs
    while rank 0 waits inside another collective (rank 0's own handler waits for that collective to return)
    then waits in the broadcast for good: a preempted 2-rank test hung with every rank alive."""
    folder, _ = trained_run
    ready = tmp_path / "pausing"
    args = ["test", "--config", RETRIEVAL, "--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.precision=32-true",
            f"--data.data_path={mini_dataset / 'random'}", f"--data.corpus_path={mini_dataset / 'corpus.jsonl'}",
            "--data.max_seq_len=64", "--trainer.callbacks+=tests.helpers.PauseBesideACollective",
            f"--trainer.callbacks.ready={ready}", f"--ckpt_path={folder / 'checkpoints' / 'retrieval' / 'last.ckpt'}"]
    try:
        returncode, stderr = signal_when_ready([sys.executable, str(REPO / "main.py"), *args], tmp_path, ready,
                                               "SIGTERM", to_group=True, wait=300)
    except subprocess.TimeoutExpired:
        pytest.fail("the ranks were still running 120 s after SIGTERM reached them all")
    assert returncode == 143, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error")]
    assert errors == ["error: test stopped by SIGTERM; run the same command again"], stderr[-3000:]


def _processes_working_in(folder: Path) -> list[int]:
    """Live processes (not zombies) whose working folder is `folder`: a run's ranks (Linux's /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and Path(os.readlink(entry / "cwd")) == folder:
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def paused_validate_on_two_ranks(dataset: Path, trained_run: tuple[Path, str], ready: Path, *extra: str) -> list[str]:
    """`validate` of the trained run's checkpoint on 2 ranks; rank 0 touches `ready` in its first batch and sleeps
    there (tests.helpers.PauseInEvaluation) while rank 1 goes on to wait for it in a collective."""
    checkpoint = trained_run[0] / "checkpoints" / "retrieval" / "last.ckpt"
    return ["validate", "--config", RETRIEVAL, "--trainer.accelerator=cpu", "--trainer.devices=2",
            "--trainer.precision=32-true", f"--data.data_path={dataset / 'random'}",
            f"--data.corpus_path={dataset / 'corpus.jsonl'}", "--data.max_seq_len=64",
            "--trainer.callbacks+=tests.helpers.PauseInEvaluation", f"--trainer.callbacks.ready={ready}", *extra,
            f"--ckpt_path={checkpoint}"]


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/cwd"), reason="needs Linux's /proc to find the ranks left")
@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_signal_to_rank_0_alone_outside_training_stops_the_ranks_it_spawned(tmp_path, mini_dataset, trained_run,
                                                                               signal_name):
    """`kill -INT PID`, an IDE's stop button or a parent process reach rank 0 alone. Lightning passes SIGTERM on to
    the ranks it spawned, not SIGINT: rank 0 left at once, and rank 1, waiting for it in a collective, failed
    there afterwards with a "no lost rank was found" line and a collective error of its own."""
    ready = tmp_path / "evaluating"
    args = paused_validate_on_two_ranks(mini_dataset, trained_run, ready)
    returncode, _ = signal_when_ready([sys.executable, str(REPO / "main.py"), *args], tmp_path, ready, signal_name,
                                      to_group=False, wait=300)
    left = _processes_working_in(tmp_path)
    deadline = time.time() + 60
    while _processes_working_in(tmp_path) and time.time() < deadline:  # let a survivor say what it would say
        time.sleep(0.2)
    for pid in _processes_working_in(tmp_path):
        os.kill(pid, signal.SIGKILL)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert returncode == 128 + signal.Signals[signal_name], stderr[-3000:]
    assert left == [], f"rank 0 left ranks behind: {left}"
    errors = [line for line in stderr.splitlines() if line.startswith("error")]
    assert errors == [f"error: validate stopped by {signal_name}; run the same command again"], stderr[-3000:]


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"),
                    reason="needs Linux's /proc children lists to find the spawned rank")
def test_a_signal_to_another_rank_alone_outside_training_is_named_as_that_stop(tmp_path, mini_dataset, trained_run):
    """`kill PID` on rank 1: it stops at once, silent as every rank but 0 is; rank 0's next collective then failed
    with "no lost rank was found" and exit 4, as if a rank had died."""
    ready = tmp_path / "evaluating"
    args = paused_validate_on_two_ranks(mini_dataset, trained_run, ready, "--trainer.callbacks.seconds=5")
    errors = tmp_path / "stderr.txt"
    with open(errors, "w") as err:
        process = subprocess.Popen([sys.executable, str(REPO / "main.py"), *args], cwd=tmp_path, env=launch_env(),
                                   stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        try:
            deadline = time.time() + 300
            while not ready.exists() and process.poll() is None and time.time() < deadline:
                time.sleep(0.1)
            assert ready.exists(), errors.read_text()[-3000:]  # rank 0 sleeps in its first batch; rank 1 goes on
            rank_1 = int(Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()[0])
            os.kill(rank_1, signal.SIGTERM)
            process.wait(timeout=120)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    stderr = errors.read_text()
    assert process.returncode == 143, stderr[-3000:]
    assert [line for line in stderr.splitlines() if line.startswith("error")] == [
        f"error: rank 1 (pid {rank_1}) stopped on SIGTERM; the other ranks stop with it; run the same command again"
    ], stderr[-3000:]


def _spawned_rank_loading_torch(pid: int) -> bool:
    """Whether a rank that process `pid` spawned has mapped torch's library (Linux's /proc). Its environment
    must be rank 1's: between fork and exec the child is a copy of rank 0, torch included, and a signal
    there is lost with the copy."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return False
    for child in children:
        try:
            if (b"LOCAL_RANK=1\0" in Path(f"/proc/{child}/environ").read_bytes()
                    and "libtorch" in Path(f"/proc/{child}/maps").read_text()):
                return True
        except OSError:  # gone, or exec'ing
            continue
    return False


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"),
                    reason="needs Linux's /proc children lists to see when the spawned rank loads torch")
def test_ctrl_c_while_the_ranks_start_ends_rank_0_waiting_in_the_rendezvous(tmp_path, mini_dataset):
    """The spawned ranks stop on it before they join; rank 0, in torch's rendezvous (no signal handler runs
    there), would wait for them for the 364-day timeout if its observer did not end it."""
    env = launch_env()
    errors = tmp_path / "stderr.txt"
    with open(errors, "w") as err:
        process = subprocess.Popen([sys.executable, str(REPO / "main.py"), *fit_args(mini_dataset)], cwd=tmp_path, env=env,
                                   stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as in a terminal
        try:
            deadline = time.time() + 300
            # Rank 1 past Python's own start (a Ctrl-C there is the interpreter's fatal error) and loading its
            # libraries, seconds before it would join: where a KeyboardInterrupt raised into torch aborted it.
            while not _spawned_rank_loading_torch(process.pid) and time.time() < deadline:
                assert process.poll() is None, errors.read_text()[-3000:]
                time.sleep(0.01)
            assert "Initializing distributed: GLOBAL_RANK: 1" not in errors.read_text()
            os.killpg(process.pid, signal.SIGINT)
            process.wait(timeout=60)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    stderr = errors.read_text()
    assert process.returncode == 130, stderr[-3000:]
    assert "error (rank 0): stopped by SIGINT: the other ranks stopped on it before they joined" in stderr
    assert "Traceback" not in stderr
