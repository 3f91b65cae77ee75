"""SIGTERM and Ctrl-C during a real 2-rank fit: a resumable checkpoint, a non-zero exit, and an exact resume."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slow  # real subprocesses

RETRIEVAL = str(REPO / "configs" / "retrieval.yaml")


def fit_args(dataset: Path, num_workers: int = 0) -> list[str]:
    return [
        "fit", "--config", RETRIEVAL, "--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.precision=32-true",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.accumulate_grad_batches=1",
        f"--data.data_path={dataset / 'random'}", f"--data.corpus_path={dataset / 'corpus.jsonl'}", "--data.max_seq_len=64",
        "--data.batch_size=4", "--progressive.epochs_per_repo=2", f"--data.num_workers={num_workers}",
    ]


def final_state(workdir: Path) -> tuple[dict, float]:
    checkpoint = torch.load(workdir / "checkpoints" / "retrieval" / "last.ckpt", weights_only=True)
    metrics = (max(workdir.glob("lightning_logs/retrieval/version_*"), key=lambda p: int(p.name[8:])) / "metrics.csv").read_text()
    header, *rows = metrics.splitlines()
    column = header.split(",").index("Recall@10_val")
    recall = [float(r.split(",")[column]) for r in rows if r.split(",")[column]][-1]
    return checkpoint, recall


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("signal_name, code", [("SIGTERM", 143)])
def test_a_fit_stopped_mid_epoch_and_resumed_equals_an_uninterrupted_fit(tmp_path, mini_dataset, signal_name, code, num_workers):
    # Worker processes draw their first indices when the loader's iterator is made (before Lightning sets
    # the epoch of a resumed fit): with 2 workers the resumed epoch must still skip what was trained.
    straight = tmp_path / "straight"
    straight.mkdir()
    result = run_cli(fit_args(mini_dataset), cwd=straight)
    assert result.returncode == 0, result.stderr[-3000:]
    expected, expected_recall = final_state(straight)
    steps_per_epoch = expected["global_step"] // 2
    assert steps_per_epoch >= 3

    stopped = tmp_path / "stopped"
    stopped.mkdir()
    stop_at = steps_per_epoch + steps_per_epoch // 2  # the middle of epoch 1
    result = run_cli([*fit_args(mini_dataset, num_workers), f"--trainer.callbacks+=tests.helpers.SignalAtStep",
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
