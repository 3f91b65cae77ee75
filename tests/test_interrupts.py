"""stop_on_signals in process: a signal becomes Interrupted at once, Lightning's silent SystemExit too, and the
handlers in place before come back."""

from __future__ import annotations

import os
import signal
import time

import pytest
from pytorch_lightning.utilities.exceptions import SIGTERMException

from leanagent.interrupts import SIGNALS, Interrupted, stop_on_signals


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_inside_raises_interrupted_at_once_with_its_exit_code(signum):
    before = {s: signal.getsignal(s) for s in SIGNALS}
    start = time.monotonic()
    with pytest.raises(Interrupted) as stopped:
        with stop_on_signals("test", "run it again"):
            os.kill(os.getpid(), signum)
            time.sleep(10)
    assert time.monotonic() - start < 5
    assert stopped.value.exit_code == 128 + signum
    assert str(stopped.value) == f"test stopped by {signal.Signals(signum).name}; run it again"
    assert {s: signal.getsignal(s) for s in before} == before


def test_lightnings_sigterm_exit_becomes_interrupted():
    with pytest.raises(Interrupted) as stopped:
        with stop_on_signals("validate"):
            raise SIGTERMException  # what Lightning's evaluation loop raises after its SIGTERM flag: exit status 0
    assert stopped.value.exit_code == 143


def test_a_handler_installed_inside_takes_over_until_it_restores_ours():
    seen = []
    with stop_on_signals("outer"):
        ours = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        signal.signal(signal.SIGTERM, ours)
    assert seen == [signal.SIGTERM]


def test_a_signal_that_code_inside_caught_and_reported_as_something_else_is_still_the_signal():
    """A library that catches what it calls (jsonargparse resolving a class_path) reports our Interrupted as
    its own error: a Ctrl-C while the config was parsed told the user their config file was wrong (exit 2)."""
    with pytest.raises(Interrupted) as stopped:
        with stop_on_signals("fit"):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(10)
            except Exception as caught:
                raise ValueError("trainer.callbacks: not a valid callback") from caught
    assert stopped.value.exit_code == 130
    assert str(stopped.value) == "fit stopped by SIGINT; run the same command again"


def test_interrupted_passes_through_code_that_catches_errors_and_goes_on():
    """Ours did so too: `except LeanAgentError` around an optional val split caught a Ctrl-C that landed while the
    split was read, and the fit went on as if no signal had come."""
    from leanagent.errors import LeanAgentError

    went_on = []
    with pytest.raises(Interrupted):
        with stop_on_signals("fit"):
            for catch in (Exception, LeanAgentError):
                try:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(10)
                except catch:
                    went_on.append(catch)
    assert went_on == []


def test_an_error_with_no_signal_stays_that_error():
    with pytest.raises(ValueError, match="a real error"):
        with stop_on_signals("fit"):
            raise ValueError("a real error")


@pytest.mark.slow  # a real CLI process that signals itself while it imports the config's callback
def test_ctrl_c_while_the_config_is_parsed_is_the_signal_not_a_config_error(tmp_path):
    """Through the app: the signal lands while jsonargparse imports a callback's module (tests/ctrl_c_on_import.py)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    args = [sys.executable, str(REPO / "main.py"), "fit", "--config", str(REPO / "configs/retrieval.yaml"),
            "--trainer.callbacks+=tests.ctrl_c_on_import.Pressed"]
    result = subprocess.run(args, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                            text=True, timeout=120, preexec_fn=_default_sigint)
    assert result.returncode == 130, result.stderr[-2000:]
    assert [line for line in result.stderr.splitlines() if line.startswith("error")] == [
        "error: fit stopped by SIGINT; run the same command again"], result.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _loading_torch(pid: int) -> bool:
    """Whether the process has mapped torch's library (Linux: /proc/PID/maps): it is inside our imports."""
    with open(f"/proc/{pid}/maps") as maps:
        return any("libtorch" in line for line in maps)


def _ctrl_c_while_loading(args: list[str], cwd) -> tuple[int, str, str]:
    """Start `args`, press Ctrl-C once torch is loading; (exit code, stdout, stderr)."""
    import subprocess

    process = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_default_sigint)  # as in a terminal: pytest-xdist's workers ignore SIGINT
    deadline = time.monotonic() + 30
    while not _loading_torch(process.pid) and time.monotonic() < deadline:
        time.sleep(0.005)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    return process.returncode, out, err


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc to see when torch is loading")
def test_ctrl_c_while_the_libraries_load_is_one_line(tmp_path):
    """Python is up and torch and Lightning are loading: no KeyboardInterrupt traceback."""
    import sys

    from tests.conftest import REPO

    returncode, _, err = _ctrl_c_while_loading([sys.executable, str(REPO / "main.py"), "fit", "--config",
                                                str(REPO / "configs/retrieval.yaml")], tmp_path)
    assert returncode == 130, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert len([line for line in err.splitlines() if line.startswith("error")]) == 1, err[-2000:]
    assert list(tmp_path.iterdir()) == []


# Stands in for `leanagent.cli` being imported: library code (torch's C++ callbacks through pybind11) turns an
# exception raised inside it into an abort. A spawned rank that did so was a lost rank (SIGABRT) to rank 0.
_LIBRARY_THAT_ABORTS = """
import os, signal, sys, time, types

def main():
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)
    except BaseException:
        os.abort()
    print("went on")

cli = types.ModuleType("leanagent.cli")
cli.main = main
sys.modules["leanagent.cli"] = cli
from leanagent.entry import run
run()
"""


@pytest.mark.parametrize("local_rank, lines", [("0", ["error: stopped by SIGINT before the command started or after it "
                                                      "ended; nothing was half-written; run the same command again"]),
                                               ("1", [])])
def test_ctrl_c_while_loading_ends_the_process_without_raising_into_the_library(local_rank, lines):
    """Every rank exits 130 (a stop on purpose, not a lost rank), and only the first says so."""
    import subprocess
    import sys

    from tests.conftest import REPO

    env = {**os.environ, "LOCAL_RANK": local_rank, "NODE_RANK": "0"}
    result = subprocess.run([sys.executable, "-c", _LIBRARY_THAT_ABORTS], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=60, preexec_fn=_default_sigint)
    assert result.returncode == 130, result.stderr[-2000:]
    assert result.stderr.splitlines() == lines
    assert "went on" not in result.stdout


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc to see when torch is loading")
def test_ctrl_c_while_a_benchmark_loads_is_one_line():
    """`python -m benchmarks.X` while torch loads, before the benchmark's own handlers: no traceback either."""
    import sys

    from tests.conftest import REPO

    returncode, out, err = _ctrl_c_while_loading([sys.executable, "-m", "benchmarks.retrieval_table", "--help"], REPO)
    assert returncode == 130, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert err.splitlines() == ["error: the benchmark stopped by SIGINT before it started; run the same command again"], err[-2000:]
    assert "usage" not in out  # it stopped, rather than going on to print its help


def test_importing_a_benchmark_keeps_the_callers_ctrl_c():
    """Tests (and other code) import benchmarks: Ctrl-C there stays Python's KeyboardInterrupt."""
    import subprocess
    import sys

    from tests.conftest import REPO

    code = "import signal, benchmarks.arguments; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                            preexec_fn=_default_sigint)  # as in a terminal: pytest-xdist's workers ignore SIGINT
    assert result.stdout.strip() == "True", result.stderr[-2000:]


@pytest.mark.slow  # a real benchmark process, evaluating
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_benchmark_stops_on_a_signal_at_once_with_one_line(signum, retriever_checkpoint, mini_dataset):
    """`kill PID` inside an evaluation: Lightning's handler alone only set a flag and the benchmark went on."""
    import subprocess
    import sys

    from tests.conftest import REPO

    args = [sys.executable, "-m", "benchmarks.retrieval_table", str(retriever_checkpoint), *[str(mini_dataset)] * 4]
    process = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_default_sigint)
    first = process.stdout.readline()  # "batteries-mini test: N s ...": its first evaluation is done, 11 to go
    assert " test: " in first, first + process.stderr.read()[-2000:]
    process.send_signal(signum)
    started = time.monotonic()
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, err[-2000:]
    assert time.monotonic() - started < 30, "it finished its evaluations instead of stopping"
    assert "Traceback" not in err, err[-2000:]
    assert [line for line in err.splitlines() if line.startswith("error")] == [
        f"error: the benchmark stopped by {signal.Signals(signum).name}; run the same command again"], err[-2000:]


@pytest.mark.slow  # a real benchmark process and the fit it measures
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux's /proc to find the measured run")
def test_the_memory_benchmark_takes_the_run_it_measures_with_it_when_stopped(tmp_path, mini_dataset):
    """The measured `main.py fit` runs in a session of its own; a stopped benchmark left it running, orphaned."""
    import subprocess
    import sys

    from benchmarks.memory import tree
    from tests.conftest import REPO

    args = [sys.executable, "-m", "benchmarks.memory", "--datasets", str(mini_dataset), "--ranks", "1",
            "--commands", "fit", "--workdir", str(tmp_path), "--train-batches", "100"]
    process = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run = None
    try:
        assert process.stdout.readline().startswith("running "), process.stderr.read()[-2000:]
        deadline = time.monotonic() + 30
        while not (descendants := tree(process.pid)[1:]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert descendants, "the benchmark started no run"
        run = descendants[0]  # its only child: the measured run leads its own session
        time.sleep(2)  # the run is importing or fitting
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 128 + signal.SIGTERM, err[-2000:]
        with pytest.raises(ProcessLookupError):
            os.killpg(run, 0)  # nothing of the measured run's session is left
    finally:
        process.kill()
        if run is not None:
            try:
                os.killpg(run, signal.SIGKILL)
            except ProcessLookupError:
                pass
