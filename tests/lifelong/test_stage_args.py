"""stage_args reach every stage's fit and, with EWC, its Fisher command: one that either command does not take
is refused before stage 0 trains, not after its fit (which on the Mathlib recipe is minutes in)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.lifelong.test_lifelong_run import command, tiny_repositories

pytestmark = pytest.mark.slow  # real subprocesses


def lifelong(repos: Path, out: Path, stage_args: list[str], ewc: bool) -> subprocess.CompletedProcess:
    return subprocess.run(command(repos, out, stage_args, ewc), cwd=out.parent, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("stage_args, ewc, refused_by", [
    (["--model.init_args.lr=0.001"], True, "Fisher"),        # a fit setting the Fisher module has no place for
    (["--model.init_args.no_such_option=1"], False, "fit"),   # taken by neither
])
def test_stage_args_a_stage_command_rejects_fail_before_any_stage_runs(tmp_path, stage_args, ewc, refused_by):
    repos = tiny_repositories(tmp_path / "repos")
    out = tmp_path / "out"
    result = lifelong(repos, out, stage_args, ewc)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"the {refused_by} command does not take them" in errors[0], result.stderr[-3000:]
    assert stage_args[0].split("=")[0].split(".")[-1] in errors[0]
    assert not (out / "stages").exists()  # nothing trained


def test_a_value_the_first_stage_refuses_is_its_one_error_and_a_new_run_leaves_nothing(tmp_path):
    """The stage's own `error:` line is the only one (the runner adds where it stopped, not a second error),
    the exit code is the stage's 2, and the output_dir a new run made is gone."""
    repos = tiny_repositories(tmp_path / "repos")
    out = tmp_path / "results" / "out"  # neither folder exists yet
    result = subprocess.run(command(repos, out, ["--data.batch_size=0"], False), cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: data.batch_size must be positive, got 0"], result.stderr[-3000:]
    assert "stage 0 fit" in result.stderr and "stopped on the error above" in result.stderr
    assert not out.parent.exists()
