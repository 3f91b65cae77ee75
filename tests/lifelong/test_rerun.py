"""How a lifelong run ends when a stage stops, and what the same command keeps and refuses when run again: a rerun
continues only on the repositories' files the run began with, a first stage that refused its input after it had
trained keeps its checkpoints, and a failed stage's exit code is the run's. The stages' commands are stand-ins
here (the runner's own logic is what is tested); the slow tests in test_lifelong_run.py run real ones."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import leanagent.lifelong.runner as runner_module
import leanagent.lifelong.stage_commands as stage_commands
from leanagent.errors import LeanAgentError, ReportedError
from leanagent.interrupts import Interrupted
from leanagent.lifelong.repositories import Repositories
from leanagent.lifelong.runner import LifelongRun
from leanagent.lifelong.settings import LifelongSettings
from leanagent.lifelong.stage_commands import StageFailed, StageKilled, StageRefused, run_stage
from tests.conftest import REPO
from tests.lifelong.test_lifelong_run import tiny_repositories


def settings(repos: Path, out: Path) -> LifelongSettings:
    names = Repositories(data_root=str(repos), names=["unionfind", "assoc"], bundled=None)
    return LifelongSettings(output_dir=str(out), repositories=names, order="given",
                            retrieval_config=str(REPO / "configs" / "retrieval.yaml"))


@pytest.fixture
def stages(monkeypatch) -> list[str]:
    """The stage commands' parse check stubbed out (a start from random weights); the list the test's stand-in
    stage commands record what they were asked to run in."""
    ran: list[str] = []
    monkeypatch.setattr(runner_module, "check_parses", lambda commands, cwd: {what: "model: {}\n" for what in commands})
    return ran


def stopped_by_ctrl_c(ran: list[str]):
    def run(command: list[str], cwd: Path, what: str) -> None:
        ran.append(what)
        raise Interrupted(signal.SIGINT, f"{what} stopped by SIGINT")
    return run


def test_a_rerun_on_a_repository_whose_files_changed_is_refused_and_on_the_same_files_goes_on(tmp_path, stages, monkeypatch):
    repos, out = tiny_repositories(tmp_path / "repos"), tmp_path / "out"
    monkeypatch.setattr(runner_module, "run_stage", stopped_by_ctrl_c(stages))
    with pytest.raises(Interrupted):
        LifelongRun(settings(repos, out)).run()
    assert set(json.loads((out / "state.json").read_text())["data"]) == {"unionfind", "assoc"}

    with pytest.raises(Interrupted):  # the same files: the run goes on where it stopped
        LifelongRun(settings(repos, out)).run()
    assert stages == ["stage 0 fit on unionfind"] * 2

    train = repos / "assoc" / "random" / "train.json"
    train.write_text(json.dumps(json.loads(train.read_text())[:-1]))  # still a valid split: one theorem fewer
    with pytest.raises(LeanAgentError, match=r"repository assoc has changed since it began \(random/train.json differs\)"):
        LifelongRun(settings(repos, out)).run()
    assert len(stages) == 2  # refused before any stage ran


@pytest.mark.parametrize("saved", [False, True])
def test_a_first_stage_that_refuses_its_input_removes_the_new_run_unless_it_saved_a_checkpoint(tmp_path, stages, monkeypatch, saved):
    repos, out = tiny_repositories(tmp_path / "repos"), tmp_path / "out"

    def refuse(command: list[str], cwd: Path, what: str) -> None:
        if saved:  # it trained an epoch, then stopped on its own error (a loss gone NaN, its Fisher pass)
            (cwd / "checkpoints").mkdir(parents=True)
            (cwd / "checkpoints" / "epoch=0.ckpt").write_bytes(b"an epoch's weights")
        raise StageRefused(what, cwd)

    monkeypatch.setattr(runner_module, "run_stage", refuse)
    with pytest.raises(ReportedError) as stopped:
        LifelongRun(settings(repos, out)).run()
    if saved:
        assert (out / "stages" / "00-unionfind" / "fit" / "checkpoints" / "epoch=0.ckpt").is_file()
        assert "was removed" not in str(stopped.value)
    else:
        assert not out.exists() and "was removed" in str(stopped.value)


@pytest.mark.parametrize("code, error, exit_code", [
    ("sys.exit(2)", StageRefused, 2),  # refused its input, having printed why
    ("sys.exit(1)", StageFailed, 1),  # the disk (its own `error:` line) or a crash (a traceback): not the input
    ("os.kill(os.getpid(), signal.SIGKILL)", StageKilled, 1),  # printed nothing: the runner's line is the one
])
def test_a_stage_that_fails_ends_the_run_with_its_code_and_one_error_line(tmp_path, code, error, exit_code):
    with pytest.raises(error) as stopped:
        run_stage([sys.executable, "-c", f"import os, signal, sys; {code}"], tmp_path, "stage 0 fit on x")
    assert stopped.value.exit_code == exit_code
    assert isinstance(stopped.value, ReportedError) != (error is StageKilled)  # printed bare, after the stage's own
    if error is StageKilled:
        assert "killed by SIGKILL" in str(stopped.value)


def test_a_signal_while_the_stage_commands_parse_leaves_none_of_them_running(tmp_path, monkeypatch):
    started: list[subprocess.Popen] = []

    class Stopped(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

        def communicate(self, *args, **kwargs):
            raise Interrupted(signal.SIGTERM, "the lifelong run stopped by SIGTERM")

    monkeypatch.setattr(stage_commands.subprocess, "Popen", Stopped)
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(Interrupted):
        stage_commands.check_parses({"fit": sleep, "Fisher": sleep}, tmp_path)
    assert len(started) == 2 and all(child.poll() is not None for child in started)
