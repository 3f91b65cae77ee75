"""One lifelong run per output_dir: a second command on a folder another process is running in is refused."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from leanagent.errors import LeanAgentError
from leanagent.lifelong.repositories import Repositories
from leanagent.lifelong.runner import LifelongRun
from leanagent.lifelong.settings import LifelongSettings

HOLD = "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)"


def run(out: Path, data_root: Path) -> None:
    spec = Repositories(data_root=str(data_root), names=["absent"], bundled=None)
    LifelongRun(LifelongSettings(output_dir=str(out), repositories=spec)).run()


def test_a_folder_another_process_runs_in_is_refused_and_free_again_once_it_is_killed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "theirs.txt").write_text("the other run's file\n")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LeanAgentError, match=f"output_dir {re.escape(str(out))} is in use by another lifelong run"):
            run(out, tmp_path / "data")
        assert sorted(p.name for p in out.iterdir()) == ["theirs.txt"]  # nothing written, nothing removed
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    # The kernel dropped the killed holder's lock: the same run now gets past it, to the next check.
    with pytest.raises(LeanAgentError) as refused:
        run(out, tmp_path / "data")
    assert "in use" not in str(refused.value)


def test_the_curriculum_does_not_split_the_bundled_dataset_again_under_a_running_lifelong_run(tmp_path, capsys):
    """With other settings it would replace the repository folders the run's stage is reading."""
    from leanagent.cli import main
    from tests.conftest import BUNDLED, config_args

    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit) as stopped:
            main(["curriculum", *config_args(["lifelong.yaml"]), f"--repositories.bundled={BUNDLED}", f"--output_dir={out}"])
        assert stopped.value.code == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert errors == [f"error: output_dir {out} is in use by a lifelong run, whose repositories this command would "
                          "write again: wait for it to end, or give another output_dir"]
        assert list(out.iterdir()) == []
        with pytest.raises(SystemExit):  # repositories of its own (here none) write nothing there: no lock to wait for
            main(["curriculum", *config_args(["lifelong.yaml"]), f"--repositories.data_root={tmp_path / 'none'}",
                  f"--output_dir={out}"])
        assert "repositories.data_root" in capsys.readouterr().err
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
