"""Hangs and lost ranks (leanagent/faults/): unit tests, and real 2- and 3-rank gloo runs (slow)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from leanagent.faults import collectives, flight_recorder, heartbeats, lost_ranks, rank_observer, stall_report
from leanagent.faults.state import EXIT_STALLED, FaultState, state
from leanagent.faults.watchdog import Watchdog, WatchThread
from tests.conftest import REPO

RETRIEVAL = str(REPO / "configs" / "retrieval.yaml")


@pytest.fixture(autouse=True)
def fresh_fault_state():
    """Each test starts with no heartbeat, observer or end decided, as a new process would."""
    saved = dict(vars(state))
    vars(state).update(vars(FaultState()))
    yield
    vars(state).update(saved)


# Unit tests.
def record(rank: int, phase: str, step, age: float, now: float, **extra) -> dict:
    base = {"rank": rank, "world_size": 3, "host": socket.gethostname(), "pid": os.getpid(), "phase": phase,
            "step": step, "calls": 0, "seq": 5, "time": now - age, "phase_since": now - age, "alive": now, "state": "running"}
    return {**base, **extra}


def test_stall_lines_name_the_most_idle_rank_first_in_the_grep_able_form():
    now = time.time()
    records = {0: record(0, "train step (backward)", "3 of epoch 0", 21, now), 1: record(1, "train step", "3 of epoch 0", 25, now)}
    lines = stall_report.stall_lines(records, records, now)
    assert lines == [
        "stalled: rank 1 (phase train step, step 3 of epoch 0) has made no progress for 0:00:25",
        "stalled: rank 0 (phase train step (backward), step 3 of epoch 0) has made no progress for 0:00:21",
    ]
    # With flight recorders, the rank behind in collectives comes first even if another one is idle longer.
    assert stall_report.stall_lines(records, records, now, {0: 37, 1: 38})[0].startswith("stalled: rank 0")
    text = stall_report.format_stall_report(records, {1: records[1]}, 20.0, 0, {0: "Thread 0x1 ...", 1: "not available: stopped"}, now)
    assert text.splitlines()[0].startswith("stalled: rank 1 (phase train step")
    assert "rank 2: no heartbeat here" in text and "--- Python stack of rank 1 ---" in text


def test_heartbeat_files_are_written_atomically_and_read_back(tmp_path):
    heartbeats.write_json(tmp_path / "rank0.json", {"rank": 0, "phase": "x"})
    (tmp_path / "rank1.json").write_text("{not json")  # half-written by someone else: skipped
    assert list(heartbeats.read_heartbeats(tmp_path)) == [0]
    assert not list(tmp_path.glob(".*tmp"))


def test_process_state_and_lost_ranks(tmp_path):
    now = time.time()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    heartbeats.write_json(tmp_path / "rank0.json", record(0, "train step", 1, 0, now))
    heartbeats.write_json(tmp_path / "rank1.json", record(1, "validation", 2, 0, now, pid=child.pid))
    heartbeats.write_json(tmp_path / "rank2.json", record(2, "x", 2, 0, now, host="elsewhere"))
    assert heartbeats.process_state(record(0, "x", 1, 0, now)) == "running"
    assert [r for r, _, _ in lost_ranks.lost_ranks(tmp_path)] == [1]
    line = lost_ranks.lost_rank_line(1, heartbeats.read_heartbeats(tmp_path)[1], "killed by SIGKILL")
    assert line.startswith("error: rank 1 (pid ") and "phase validation, step 2" in line


def test_the_lost_rank_is_named_once_per_folder(tmp_path, capsys):
    assert lost_ranks.report_lost(tmp_path, 3, None, "killed by SIGKILL")
    assert not lost_ranks.report_lost(tmp_path, 3, None, "killed by SIGKILL")
    assert capsys.readouterr().err.count("error: rank 3") == 1


class _Exited:
    """A finished child process as the observer sees it (Popen's poll and returncode)."""

    def __init__(self, code: int) -> None:
        self.returncode = code

    def poll(self) -> int:
        return self.returncode

    def kill(self) -> None:
        pass


@pytest.mark.parametrize("codes", [(143,), (130, 130, 130), (0, 143)])
def test_ranks_that_stopped_on_sigterm_or_ctrl_c_are_not_called_lost(codes, monkeypatch, tmp_path, capsys):
    """Children that exit 128 + SIGTERM/SIGINT after rank 0 saved were preempted: no `lost` line, and the
    observer must not end rank 0 (exit 4) while it is still saving or exiting with its own code."""
    monkeypatch.setattr(rank_observer, "LOST_GRACE_S", 0.0)
    monkeypatch.setattr(rank_observer, "_joined", lambda: True)
    monkeypatch.setattr(state, "folder", tmp_path)
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    observer = rank_observer.RankObserver([_Exited(c) for c in codes])
    assert observer.check() is True  # nothing more to watch
    assert "lost" not in capsys.readouterr().err and not observer.named and exits == []


@pytest.mark.parametrize("codes, ended", [((130, 130, 130), [130]), ((0, 0), [])])
def test_ranks_that_stopped_before_joining_end_rank_0_stuck_in_the_rendezvous(codes, ended, monkeypatch, tmp_path, capsys):
    """Ctrl-C while the ranks start: the children stop, rank 0 waits in torch's rendezvous (a C++ call that runs
    no signal handler) for ranks that will never come; the observer ends it with the children's code."""
    monkeypatch.setattr(rank_observer, "LOST_GRACE_S", 0.0)
    monkeypatch.setattr(rank_observer, "_joined", lambda: False)
    monkeypatch.setattr(state, "folder", tmp_path)
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    assert rank_observer.RankObserver([_Exited(c) for c in codes]).check() is True
    err = capsys.readouterr().err
    assert exits == ended and ("stopped by SIGINT: the other ranks stopped on it before they joined" in err) == bool(ended)


def test_a_rank_killed_beside_preempted_ones_is_still_named(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(rank_observer, "LOST_GRACE_S", 0.0)
    monkeypatch.setattr(state, "folder", tmp_path)
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    observer = rank_observer.RankObserver([_Exited(143), _Exited(-9)])
    assert observer.check() is True
    err = capsys.readouterr().err
    assert "error: rank 2 was lost: killed by SIGKILL" in err and "rank 1 " not in err and exits == [4]


def test_rank_0_passes_its_signal_on_and_kills_ranks_that_do_not_stop(monkeypatch, tmp_path, capsys):
    """One child stops on the passed-on SIGINT; one ignores it (as a rank inside a collective does) and is killed
    after the grace; neither is reported lost, and the observer no longer ends rank 0 for them."""
    ignoring = "import signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print(flush=True); time.sleep(60)"
    stopping = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(60)"],
                                stdout=subprocess.PIPE,  # as in a terminal: pytest-xdist's workers ignore SIGINT
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deaf = subprocess.Popen([sys.executable, "-c", ignoring], stdout=subprocess.PIPE)
    try:
        for child in (stopping, deaf):
            child.stdout.readline()  # its handlers are in place
        observer = rank_observer.RankObserver([stopping, deaf])
        monkeypatch.setattr(state, "observer", observer)
        monkeypatch.setattr(state, "folder", tmp_path)
        exits: list[int] = []
        monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
        started = time.monotonic()
        rank_observer.pass_on_signal(signal.SIGINT, grace_s=1.0)
        assert time.monotonic() - started < 10
        assert stopping.wait(timeout=10) != -signal.SIGKILL  # stopped by the signal itself, not killed
        assert deaf.wait(timeout=10) == -signal.SIGKILL
        assert observer.check() is True and exits == [] and not observer.named
        assert "lost" not in capsys.readouterr().err
    finally:
        for child in (stopping, deaf):
            if child.poll() is None:
                child.kill()
            child.wait()


def test_a_rank_stopped_on_a_signal_is_named_once_as_that_stop_and_gives_its_exit_code(tmp_path, capsys):
    """Its heartbeat's final state says which signal; every survivor gets the code, one of them prints the line."""
    from leanagent.interrupts import Interrupted
    from leanagent.faults.watchdog import final_state

    assert final_state(Interrupted(signal.SIGTERM, "validate stopped by SIGTERM")) == "stopped by SIGTERM"
    assert final_state(RuntimeError("Connection closed by peer")) == "failed"
    now = time.time()
    heartbeats.write_json(tmp_path / "rank0.json", record(0, "validation", 0, 0, now))
    heartbeats.write_json(tmp_path / "rank1.json", record(1, "validation", 2, 0, now, state="failed"))
    assert lost_ranks.report_stopped_rank(tmp_path, exclude=0) is None  # a failure is no stop on purpose
    heartbeats.write_json(tmp_path / "rank2.json", record(2, "validation", 2, 0, now, pid=4321, state="stopped by SIGINT"))
    assert [lost_ranks.report_stopped_rank(tmp_path, exclude=r) for r in (0, 1)] == [130, 130]
    assert lost_ranks.report_stopped_rank(tmp_path, exclude=2) is None  # the stopped rank itself
    assert capsys.readouterr().err.splitlines() == [
        "error: rank 2 (pid 4321) stopped on SIGINT; the other ranks stop with it; run the same command again"]


def stopped_child() -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(child.pid, signal.SIGSTOP)
    deadline = time.time() + 10
    while heartbeats.process_state({"pid": child.pid, "host": socket.gethostname()}) != "stopped" and time.time() < deadline:
        time.sleep(0.05)
    return child


def test_the_report_has_the_reporters_own_stack_and_says_why_a_stopped_rank_has_none(tmp_path):
    now = time.time()
    child = stopped_child()
    try:
        records = {0: record(0, "train step (backward)", "3 of epoch 0", 12, now, stack_file="stack-rank0.txt", stacks=True),
                   1: record(1, "train step", "3 of epoch 0", 30, now, pid=child.pid, stack_file="stack-rank1.txt", stacks=True)}
        stacks = stall_report.dump_stacks(tmp_path, records, me=0)
    finally:
        child.kill()
        child.wait()
    assert stacks[1].startswith("not available: the process is stopped (SIGSTOP/SIGTSTP) and cannot dump its stack")
    assert "File " in stacks[0] and "dump_stacks" in stacks[0]  # this thread, caught inside the report


@pytest.mark.parametrize("action", ["report", "abort"])
def test_the_watch_thread_reports_a_stall_once_and_only_abort_ends_the_job(action, tmp_path, monkeypatch, capsys):
    now = time.time()
    logs = tmp_path / "version_0"
    logs.mkdir()
    heartbeats.write_json(tmp_path / "rank0.json", record(0, "train step (backward)", "3 of epoch 0", 0, now, log_dir=str(logs), stacks=False))
    heartbeats.write_json(tmp_path / "rank1.json", record(1, "train step", "3 of epoch 0", 25, now, stacks=False))
    exits: list[int] = []
    killed: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    monkeypatch.setattr(os, "kill", lambda pid, signum: killed.append(pid))
    heartbeat = type("Heartbeat", (), {"folder": tmp_path, "rank": 0, "record": {"world_size": 2}, "mark": lambda self, s: None})()
    thread = WatchThread(heartbeat, timedelta(seconds=20), action)
    thread.check()
    thread.check()  # the same episode: no second report
    err = capsys.readouterr().err
    assert err.count("stalled: rank 1 (phase train step, step 3 of epoch 0) has made no progress for 0:00:2") == 1
    assert (logs / "stall-report.txt").read_text().startswith("stalled: rank 1 ")
    if action == "abort":
        assert exits == [EXIT_STALLED] and killed == [os.getpid()]  # rank 1's pid in the fake record
        assert re.search(r"^error: watchdog: rank 1 made no progress for 0:00:2\d \(phase train step", err, re.M)
    else:
        assert exits == [] and killed == [] and "the job keeps waiting (watchdog.action=report)" in err


def test_collective_errors_are_recognised_through_the_chain():
    gloo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234")
    try:
        try:
            raise gloo
        except RuntimeError as e:
            raise ValueError("wrapped") from e
    except ValueError as wrapped:
        assert collectives.collective_error(wrapped) is gloo
    assert collectives.collective_error(RuntimeError("shapes do not match")) is None
    assert collectives.one_line(gloo) == "RuntimeError: Connection closed by peer [127.0.0.1]:1234"
    reset = RuntimeError("[/__w/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:9871: Connection reset by peer. This is typically caused by a remote worker hanging")
    assert collectives.one_line(reset) == "RuntimeError: Read error [127.0.0.1]:9871: Connection reset by peer"


def test_watchdog_settings_are_validated():
    from leanagent.errors import LeanAgentError

    assert Watchdog(stall_after=timedelta(seconds=20), action="abort").stall_after == timedelta(seconds=20)
    with pytest.raises(LeanAgentError, match="stall_after"):
        Watchdog(stall_after=timedelta(0))
    with pytest.raises(LeanAgentError, match="action"):
        Watchdog(action="explode")


def print_config(args: list[str], capsys) -> str:
    """`main.py ... --print_config` in this process: parsing only, no process to start."""
    from leanagent.cli import main

    with pytest.raises(SystemExit) as done:
        main(args)
    assert done.value.code in (None, 0), capsys.readouterr().err[-2000:]
    return capsys.readouterr().out


def test_cli_has_top_level_watchdog_flags_and_a_loadable_config(tmp_path, monkeypatch, capsys):
    from pytorch_lightning.strategies.launchers import subprocess_script

    # main() installs the fault handling for this process; undo it for the tests that follow.
    monkeypatch.setattr(subprocess_script, "_launch_process_observer", subprocess_script._launch_process_observer)
    environment = dict(os.environ)
    try:
        printed = print_config(["fit", "--config", RETRIEVAL, "--watchdog.stall_after=0:00:20", "--watchdog.action=abort", "--print_config"], capsys)
        assert re.search(r"watchdog:\n  stall_after: 0:00:20\n  action: abort", printed), printed[-2000:]
        config = tmp_path / "config.yaml"
        config.write_text(printed)
        assert "stall_after: 0:00:20" in print_config(["fit", "--config", str(config), "--print_config"], capsys)
    finally:
        os.environ.clear()
        os.environ.update(environment)


def test_flight_recorder_env_is_set_only_where_unset(monkeypatch):
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "50")
    changed = flight_recorder.set_flight_recorder_env()
    assert changed == {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    assert "TORCH_FR_BUFFER_SIZE" not in os.environ


# Real processes.
def launch(args: list[str], cwd: Path, log: Path, extra_env: dict | None = None, argv0: list[str] | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_", "LEANAGENT_", "TORCHELASTIC"))}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra_env or {})
    command = argv0 or [sys.executable, str(REPO / "main.py")]
    args = [*args, f"--trainer.default_root_dir={cwd}"]  # also the marker that finds this run's processes
    return subprocess.Popen([*command, *args], cwd=cwd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def fit_args(dataset: Path, devices: int, *extra: str) -> list[str]:
    return [
        "fit", "--config", RETRIEVAL, "--trainer.accelerator=cpu", f"--trainer.devices={devices}",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.precision=32-true",
        f"--data.data_path={dataset / 'random'}", f"--data.corpus_path={dataset / 'corpus.jsonl'}",
        "--data.max_seq_len=64", "--data.batch_size=2", "--data.num_hard_negatives=0",  # no BM25 pools to build
        "--trainer.accumulate_grad_batches=1", *extra,
    ]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def rank_in_phase(folder: Path, rank: int, prefix: str):
    def check():
        record = heartbeats.read_heartbeats(folder).get(rank) if folder.is_dir() else None
        return record if record and str(record.get("phase", "")).startswith(prefix) else None

    return check


def processes_with(marker: str) -> list[int]:
    """Pids whose command line contains `marker` (no psutil: /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
            except OSError:
                continue
            if marker in cmdline and state != "Z":
                found.append(int(entry.name))
    return found


def kill_group(proc: subprocess.Popen, marker: str) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait(timeout=30)
    for pid in processes_with(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


STALL_AFTER_S = 10  # above the slowest phase without progress before the stall (data loading on a busy machine)


@pytest.mark.slow
def test_a_rank_asleep_in_a_step_is_reported_with_every_ranks_stack_and_abort_ends_the_job(mini_dataset, tmp_path):
    """Rank 1 sleeps inside a train step (rank 0 then waits in backward's all-reduce): the report names rank 1
    first with its phase and both ranks' stacks, lands in stall-report.txt, and action=abort ends the job."""
    beats = tmp_path / "beats"
    log = tmp_path / "log.txt"
    env = {"LEANAGENT_HEARTBEAT_DIR": str(beats), "LEANAGENT_TEST_SLEEP_RANK": "1"}
    args = fit_args(mini_dataset, 2, f"--watchdog.stall_after=0:00:{STALL_AFTER_S:02d}", "--watchdog.action=abort",
                    "--trainer.callbacks+=tests.helpers.SleepInStep")
    proc = launch(args, tmp_path, log, env)
    try:
        code = proc.wait(timeout=240)
        text = log.read_text()
        assert code == EXIT_STALLED, text[-4000:]
        first = next(line for line in text.splitlines() if line.startswith("stalled:"))
        assert re.match(rf"stalled: rank 1 \(phase train step, step 2 of epoch 0\) has made no progress for 0:00:{STALL_AFTER_S // 10}\d", first), first
        report = text[text.index(first):]
        rank1_stack = report.split("--- Python stack of rank 1 ---")[1]
        assert "in on_before_backward" in rank1_stack and "helpers.py" in rank1_stack  # dumped by rank 1 on SIGUSR2
        assert re.search(r"--- Python stack of rank 0 ---\n.*File ", report, re.S)  # the reporter's own stack
        saved = next((tmp_path / "lightning_logs" / "retrieval").glob("version_*/stall-report.txt")).read_text()
        assert saved.startswith("stalled: rank 1 (phase train step")
        assert re.search(rf"^error: watchdog: rank \d made no progress for 0:00:{STALL_AFTER_S // 10}\d \(phase ", text, re.M)
        wait_for(lambda: not processes_with(str(tmp_path)), 10, "no rank left behind")
    finally:
        kill_group(proc, str(tmp_path))
        if os.environ.get("LEANAGENT_KEEP_TEST_LOGS"):
            (Path(os.environ["LEANAGENT_KEEP_TEST_LOGS"]) / "sleep.log").write_text(log.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("victim", [1, 0])
def test_a_killed_rank_ends_the_job_with_one_line_that_names_it(victim, mini_dataset, tmp_path):
    """Three ranks: two survivors that could each name the victim, so the one line is agreed, not luck.
    Rank 1 is named by rank 0's observer of the ranks it spawned; rank 0 (the launcher) by a survivor."""
    devices = 3
    beats = tmp_path / "beats"
    log = tmp_path / "log.txt"
    proc = launch(fit_args(mini_dataset, devices, "--progressive.epochs_per_repo=20"), tmp_path, log, {"LEANAGENT_HEARTBEAT_DIR": str(beats)})
    marker = str(tmp_path)
    try:
        target = wait_for(rank_in_phase(beats, victim, "train step"), 150, f"rank {victim} in a train step")
        before = len(log.read_text().splitlines())
        os.kill(target["pid"], signal.SIGKILL)
        killed = time.time()
        code = proc.wait(timeout=60)
        wait_for(lambda: not processes_with(marker), max(1.0, 60 - (time.time() - killed)), "every rank to exit (no orphan)")
        ended = time.time() - killed
        time.sleep(0.5)
        after = log.read_text().splitlines()[before:]
        assert code != 0
        named = [line for line in after if line.startswith("error:")]
        assert len(named) == 1, "\n".join(after)
        assert re.match(rf"error: rank {victim} \(pid {target['pid']}\) was lost: .*its last known phase \S", named[0]), named[0]
        assert not any("Traceback" in line for line in after), "\n".join(after)
        for rank in set(range(devices)) - {victim}:
            assert len([line for line in after if line.startswith(f"error (rank {rank}):")]) <= 1
        print(f"{devices} ranks, rank {victim} killed: job over after {ended:.1f}s, exit {code}, {len(after)} lines after the kill")
    finally:
        kill_group(proc, marker)
        if os.environ.get("LEANAGENT_KEEP_TEST_LOGS"):
            (Path(os.environ["LEANAGENT_KEEP_TEST_LOGS"]) / f"kill-{devices}-{victim}.log").write_text(log.read_text())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_torchrun_nodes_on_localhost(toy_dataset, tmp_path):
    """`torchrun --nnodes=2 --node_rank={0,1}` as the README's multi-node launch, both "nodes" on this machine."""
    port = free_port()
    torchrun = [sys.executable, "-m", "torch.distributed.run"]  # the `torchrun` console script runs this module
    procs, logs = [], []
    try:
        for node in (0, 1):
            logs.append(tmp_path / f"node{node}.txt")
            launcher = [*torchrun, "--nnodes=2", "--nproc_per_node=1", f"--node_rank={node}", "--rdzv_backend=c10d",
                        f"--rdzv_endpoint=127.0.0.1:{port}", str(REPO / "main.py")]
            args = fit_args(toy_dataset, 1, "--trainer.num_nodes=2", "--progressive.epochs_per_repo=1", "--data.batch_size=4")
            procs.append(launch(args, tmp_path, logs[-1], argv0=launcher))
        codes = [proc.wait(timeout=300) for proc in procs]
        text = "\n".join(log.read_text() for log in logs)
        assert codes == [0, 0], text[-4000:]
        for rank in (0, 1):
            assert f"rank {rank}/2: process group timeout 364 days, 0:00:00" in text
            assert re.search(rf"rank {rank}/2: barrier 'before_data_loading' passed", text)
            assert re.search(rf"rank {rank}/2: barrier 'after_fit' passed", text)
        # The folder both ranks beat in (a fit this short may end before the watchdog's first look at it).
        seen = re.search(r"watchdog: heartbeats in (\S+),", logs[0].read_text())
        assert seen, text[-4000:]
        folder = tmp_path / seen.group(1)
        assert folder.name.startswith("torchrun-") and folder.parent == tmp_path / "lightning_logs" / "retrieval" / "heartbeats"
        records = heartbeats.read_heartbeats(folder)
        assert sorted(records) == [0, 1] and {r["state"] for r in records.values()} == {"finished"}
        assert [records[r]["node_rank"] for r in (0, 1)] == [0, 1]
        checkpoints = tmp_path / "checkpoints" / "retrieval"
        assert (checkpoints / "last.ckpt").is_file()
        assert len(list(checkpoints.glob("epoch=*.ckpt"))) == 1
    finally:
        for proc in procs:
            kill_group(proc, str(tmp_path))


def test_a_signal_handler_passes_nothing_on_to_the_other_ranks(monkeypatch):
    """A terminal's Ctrl-C reaches every rank already: a copy forwarded by rank 0 would be a second Ctrl-C
    ('stop now') on the others. Ranks agree through the all-reduce instead."""
    from leanagent.callbacks.preemption import PreemptionCheckpoint

    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, signum: sent.append((pid, signum)))
    callback = PreemptionCheckpoint()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        callback._launcher = type("Launcher", (), {"procs": [child]})()  # what Lightning's launcher holds on rank 0
        callback._handle(signal.SIGINT, None)
        forwarded = list(sent)
    finally:
        monkeypatch.undo()
        child.kill()
        child.wait()
    assert callback.received == signal.SIGINT and forwarded == []


def test_a_lifelong_stage_runs_in_its_own_process_group_and_leaves_the_advice_to_the_runner(tmp_path):
    """killpg (a terminal's Ctrl-C) on the runner's group must not reach the stage a second time."""
    from leanagent.lifelong.stage_commands import run_stage

    check = ("import os, sys; sys.exit(0 if os.getpgid(0) == os.getpid() != os.getpgid(os.getppid()) "
             "and os.environ.get('LEANAGENT_LIFELONG_STAGE') == '1' else 7)")
    run_stage([sys.executable, "-c", check], tmp_path, "stage 0 check")  # raises if the stage exited 7


@pytest.mark.slow
def test_a_lifelong_stage_dies_with_its_runner(tmp_path):
    """In its own process group a stage no longer dies of a `kill -9` to the runner's group: it must still
    die when the runner does, not train on as an orphan beside the rerun."""
    stage_script = tmp_path / "stage.py"
    stage_script.write_text(f"import os, time\nopen({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    script = tmp_path / "runner.py"
    script.write_text("import sys\nfrom pathlib import Path\nfrom leanagent.lifelong.stage_commands import run_stage\n"
                      f"run_stage([sys.executable, {str(stage_script)!r}], Path(sys.argv[1]), 'stage 0 sleep')\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runner = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env, start_new_session=True)
    deadline = time.time() + 60
    while not (tmp_path / "pid").is_file() and time.time() < deadline:
        time.sleep(0.1)
    stage = int((tmp_path / "pid").read_text())
    os.killpg(runner.pid, signal.SIGKILL)  # the runner's group: no longer the stage's
    runner.wait()
    deadline = time.time() + 10
    while time.time() < deadline and heartbeats.process_state({"pid": stage, "host": socket.gethostname()}) == "running":
        time.sleep(0.1)
    assert heartbeats.process_state({"pid": stage, "host": socket.gethostname()}) in ("gone", "zombie")
