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
