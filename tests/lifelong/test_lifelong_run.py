"""A 2-stage lifelong run end to end (2 gloo ranks per stage, EWC on): killed in stage 1 and resumed, and
stopped by Ctrl-C in stage 0 and resumed, each equal to one uninterrupted run of the same command."""

from __future__ import annotations

import csv
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

from leanagent.models.schedule import warmup_cosine
from tests.conftest import REPO, main_job_model_settings, write_subset
from tests.helpers import signal_when_ready

pytestmark = pytest.mark.slow  # real subprocesses

# Two repositories with few premises in reach (corpus embedding is most of each evaluation's cost).
FILES = {"unionfind": ("Batteries/Data/UnionFind/Basic.lean", "Batteries/Data/UnionFind/Lemmas.lean"),
         "assoc": ("Batteries/Data/AssocList.lean",)}


def tiny_repositories(root: Path) -> Path:
    """Two small repositories cut from the bundled dataset by file: real data, a few theorems each."""
    for name, files in FILES.items():
        write_subset(root / name, n_train=8, n_eval=3, files=files)
    return root


STAGE_ARGS = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--data.max_seq_len=32", "--data.batch_size=2",
              "--trainer.accumulate_grad_batches=1", "--trainer.enable_model_summary=false"]


def command(repos: Path, out: Path, stage_args: list[str] = STAGE_ARGS, ewc: bool = True) -> list[str]:
    return [sys.executable, str(REPO / "main.py"), "lifelong", "--config", str(REPO / "configs" / "lifelong.yaml"),
            f"--output_dir={out}", f"--repositories.data_root={repos}", "--repositories.names=[unionfind, assoc]",
            "--repositories.bundled=null", "--order=given", f"--ewc.enabled={str(ewc).lower()}", "--ewc.ewc_lambda=10.0",
            f"--stage_args={json.dumps(stage_args)}",
            f"--retrieval_config={REPO / 'configs' / 'retrieval.yaml'}", f"--fisher_config={REPO / 'configs' / 'fisher.yaml'}"]


def run(repos: Path, out: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command(repos, out), cwd=cwd, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def repos(tmp_path_factory) -> Path:
    return tiny_repositories(tmp_path_factory.mktemp("repos"))


@pytest.fixture(scope="module")
def straight(repos, tmp_path_factory) -> Path:
    """The output folder of one uninterrupted run, which both interrupted runs must reproduce."""
    folder = tmp_path_factory.mktemp("straight")
    result = run(repos, folder / "out", folder)
    assert result.returncode == 0, result.stderr[-4000:]
    return folder / "out"


def test_killed_in_stage_one_then_resumed_equals_an_uninterrupted_run(repos, straight, tmp_path):
    interrupted = tmp_path / "interrupted"
    process = subprocess.Popen(command(repos, interrupted), cwd=tmp_path, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = interrupted / "state.json"
    deadline = time.time() + 600
    while time.time() < deadline and process.poll() is None:
        if state.is_file() and len(json.loads(state.read_text())["stages"]) >= 1:
            break
        time.sleep(0.5)
    time.sleep(2)  # well into stage 1's fit
    os.killpg(process.pid, signal.SIGKILL)  # the orchestrator and every DDP rank, like a power cut
    process.wait()
    assert len(json.loads(state.read_text())["stages"]) == 1
    assert not (interrupted / "results.json").exists()

    resumed = run(repos, interrupted, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "stage 0 fit" not in resumed.stderr  # finished stages are not redone

    a = json.loads((interrupted / "results.json").read_text())
    b = json.loads((straight / "results.json").read_text())
    assert a["order"] == b["order"] == ["unionfind", "assoc"]
    assert len(a["evaluations"]) == 2 + 1 + 2  # test on every seen repository, val on the current one
    assert_same_rows(a["evaluations"], b["evaluations"])
    assert a["metrics"] == pytest.approx(b["metrics"], rel=1e-6, abs=1e-9, nan_ok=True)
    assert set(a["metrics"]) == {"WF5", "FM", "CFR", "EBWT", "WP5", "IP"}
    assert (interrupted / "lifelong.png").stat().st_size > 10_000
    assert (interrupted / "evaluations.csv").read_text().count("\n") == 1 + 5
    stages = json.loads(state.read_text())["stages"]
    assert stages[0]["fisher"] and stages[1]["fisher"] is None  # none after the last stage
    # The same trained models, not only the same metrics: every stage hands over identical weights.
    straight_stages = json.loads((straight / "state.json").read_text())["stages"]
    for x, y in zip(stages, straight_stages):
        weights_x = torch.load(x["checkpoint"], weights_only=True)["state_dict"]
        weights_y = torch.load(y["checkpoint"], weights_only=True)["state_dict"]
        assert weights_x.keys() == weights_y.keys()
        assert all(torch.equal(weights_x[k], weights_y[k]) for k in weights_x), x["repository"]
    # EWC is on from stage 1: its penalty is part of what those stages trained on.
    for stage in sorted((straight / "stages").iterdir())[1:]:
        (metrics,) = stage.glob("fit/lightning_logs/retrieval/version_*/metrics.csv")
        penalties = [float(r["ewc_penalty_train_step"]) for r in csv.DictReader(metrics.open()) if r.get("ewc_penalty_train_step")]
        assert penalties and max(penalties) > 0, stage.name
    settings = main_job_model_settings()
    peak, warmup = settings["lr"], settings["warmup_steps"]  # the stages' config
    for stage in sorted((straight / "stages").iterdir()):  # each stage's fit has its own whole schedule
        lrs = stage_learning_rates(stage)
        assert len(lrs) >= 3
        assert lrs == pytest.approx([peak * warmup_cosine(warmup, len(lrs))(i) for i in range(len(lrs))])


def stage_learning_rates(stage: Path) -> list[float]:
    (metrics,) = stage.glob("fit/lightning_logs/retrieval/version_*/metrics.csv")
    rows = list(csv.DictReader(metrics.open()))
    return [float(r["lr-AdamW"]) for r in rows if r.get("lr-AdamW")]


def assert_same_rows(rows_a: list[dict], rows_b: list[dict]) -> None:
    assert len(rows_a) == len(rows_b)
    for x, y in zip(rows_a, rows_b):
        assert [x[k] for k in ("stage", "trained_on", "evaluated_on", "split")] == [y[k] for k in ("stage", "trained_on", "evaluated_on", "split")]
        assert x.keys() == y.keys() and {"Recall@10/bm25", "Recall@10/hybrid", "hybrid_weight"} <= set(x)
        for key in ("Recall@1", "Recall@10", "MRR", "Recall@10/hybrid", "hybrid_weight"):  # plain names: dense
            assert x[key] == pytest.approx(y[key], rel=1e-6, abs=1e-9)


def test_ctrl_c_to_the_process_group_stops_the_stage_once_and_the_same_command_finishes_the_run(repos, straight, tmp_path):
    """A terminal's Ctrl-C reaches the runner and every process in its group; the runner passes it on to its
    stage once. The stage saves, the run exits 130 with the runner's advice only, and rerunning the
    command ends with the table of an uninterrupted run."""
    out = tmp_path / "interrupted"
    heartbeats = tmp_path / "heartbeats"
    env = {**os.environ, "LEANAGENT_HEARTBEAT_DIR": str(heartbeats)}
    with open(tmp_path / "stderr.txt", "w") as err:
        process = subprocess.Popen(command(repos, out), cwd=tmp_path, env=env, start_new_session=True,
                                   stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.time() + 600
        while process.poll() is None and time.time() < deadline:
            try:
                record = json.loads((heartbeats / "rank0.json").read_text())
            except (OSError, ValueError):
                record = {}
            if "train step" in str(record.get("phase")):  # stage 0's fit is training (any part of a step)
                os.killpg(process.pid, signal.SIGINT)
                break
            time.sleep(0.05)
        process.wait(timeout=600)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert process.returncode == 130, stderr[-4000:]
    # Exit code 130, or 0 where the signal came as the stage's last step ended (its fit then finished first).
    stopped = re.search(r"stage (\d) fit on (\w+) stopped by SIGINT \(exit code (?:130|0)\); run the same command again", stderr)
    assert stopped, stderr[-4000:]
    assert "preempted:" not in stderr and "--ckpt_path" not in stderr  # the runner's advice, not the fit's
    assert "lost" not in stderr and "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    stage = f"{int(stopped.group(1)):02d}-{stopped.group(2)}"
    last = out / "stages" / stage / "fit" / "checkpoints" / "retrieval" / "last.ckpt"
    assert last.is_file() and not (out / "results.json").exists()

    resumed = run(repos, out, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "continuing its interrupted fit" in resumed.stderr or "had finished before the interruption" in resumed.stderr
    a = json.loads((out / "results.json").read_text())
    b = json.loads((straight / "results.json").read_text())
    assert_same_rows(a["evaluations"], b["evaluations"])


@pytest.mark.parametrize("signal_name, to_group", [("SIGTERM", False), ("SIGINT", True)])
def test_a_signal_in_the_runners_own_evaluation_stops_the_run_and_the_same_command_finishes_it(
        repos, straight, tmp_path, signal_name, to_group):
    """`kill PID` of the runner, or a terminal's Ctrl-C, while the runner itself evaluates (no stage process
    to pass it to): exit 128 + signal with one line, not Lightning's silent exit 0; the rerun redoes that
    stage's evaluation only and ends with the table of an uninterrupted run."""
    out = tmp_path / "interrupted"
    ready = tmp_path / "evaluating"
    wrapper = ["-c", f"import tests.helpers as h; h.pause_lifelong_evaluations({str(ready)!r}); "
                     "from leanagent.cli import main; main()"]
    returncode, stderr = signal_when_ready([sys.executable, *wrapper, *command(repos, out)[2:]], tmp_path, ready,
                                           signal_name, to_group)
    assert returncode == 128 + signal.Signals[signal_name], stderr[-4000:]
    assert re.search(rf"error: stage 0 on unionfind stopped by {signal_name}; run the same command again", stderr), stderr[-4000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert json.loads((out / "state.json").read_text())["stages"] == [] and not (out / "results.json").exists()

    resumed = run(repos, out, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "stage 0: its fit had finished before the interruption" in resumed.stderr
    assert "stage 0 Fisher" not in resumed.stderr  # its Fisher was done too
    a = json.loads((out / "results.json").read_text())
    b = json.loads((straight / "results.json").read_text())
    assert_same_rows(a["evaluations"], b["evaluations"])
