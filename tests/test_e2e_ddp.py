"""End to end, as a user runs it: real subprocesses, 2 CPU ranks over gloo."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slow  # real subprocesses

RETRIEVAL = str(REPO / "configs" / "retrieval.yaml")
FISHER = str(REPO / "configs" / "fisher.yaml")


def data_args(dataset: Path) -> list[str]:
    return [f"--data.data_path={dataset / 'random'}", f"--data.corpus_path={dataset / 'corpus.jsonl'}", "--data.max_seq_len=64"]


def common(devices: int) -> list[str]:
    return ["--trainer.accelerator=cpu", f"--trainer.devices={devices}", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def trained(workdir: Path, mini_dataset: Path) -> tuple[Path, str]:
    result = run_cli(["fit", "--config", RETRIEVAL, *common(2), *data_args(mini_dataset), "--data.batch_size=4"], cwd=workdir)
    assert result.returncode == 0, result.stderr[-4000:]
    return workdir / "checkpoints" / "retrieval" / "last.ckpt", result.stderr


def test_fit_on_two_gloo_ranks(trained):
    checkpoint, log = trained
    assert checkpoint.is_file()
    for rank in ("0", "1"):
        assert f"rank {rank}: TORCH_NCCL_ASYNC_ERROR_HANDLING=1 NCCL_TIMEOUT={364 * 24 * 3600 * 1000} (ms)" in log
        assert f"rank {rank}/2: process group timeout 364 days, 0:00:00" in log
        assert re.search(rf"rank {rank}/2: barrier 'before_data_loading' passed", log)
        assert re.search(rf"rank {rank}/2: barrier 'after_fit' passed", log)
    saved = (checkpoint.parents[2] / "lightning_logs" / "retrieval").glob("version_*/config.yaml")
    config = next(iter(saved)).read_text()
    assert "class_path: pytorch_lightning.strategies.DDPStrategy" in config and "timeout: 364 days, 0:00:00" in config


def test_saved_config_feeds_back_into_the_cli(trained, workdir, mini_dataset):
    config = next((workdir / "lightning_logs" / "retrieval").glob("version_*/config.yaml"))
    result = run_cli(["fit", "--config", str(config), "--print_config"], cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "timeout: 364 days, 0:00:00" in result.stdout


def test_validate_counts_every_example_once_on_two_ranks(trained, workdir, mini_dataset):
    checkpoint, _ = trained
    metrics = {}
    for devices in (1, 2):
        result = run_cli(["validate", "--config", RETRIEVAL, *common(devices), *data_args(mini_dataset), f"--ckpt_path={checkpoint}", "--trainer.precision=32-true", "--data.eval_batch_size=5"], cwd=workdir)
        assert result.returncode == 0, result.stderr[-4000:]
        found = dict(re.findall(r"│\s+(\S+_val)\s+│\s+([\d.]+)\s+│", result.stdout))
        metrics[devices] = {k: float(v) for k, v in found.items()}
    assert {"Recall@1_val", "Recall@10_val", "MRR_val", "num_evaluated_val"} <= set(metrics[1])
    assert metrics[1] == pytest.approx(metrics[2], rel=1e-4)


def test_predict_writes_one_line_per_tactic_state_from_all_ranks(trained, workdir, mini_dataset):
    checkpoint, _ = trained
    result = run_cli(["predict", "--config", RETRIEVAL, *common(2), *data_args(mini_dataset), f"--ckpt_path={checkpoint}", "--model.init_args.num_retrieved=7"], cwd=workdir)
    assert result.returncode == 0, result.stderr[-4000:]
    path = Path(re.search(r"to (\S+predictions\.jsonl)", result.stderr).group(1))
    records = [json.loads(line) for line in (path if path.is_absolute() else workdir / path).read_text().splitlines()]
    expected = sum(len(t["traced_tactics"]) for s in ("train", "val", "test") for t in json.loads((mini_dataset / "random" / f"{s}.json").read_text()))
    assert len(records) == expected
    assert all(1 <= len(r["retrieved"]) <= 7 for r in records)
    assert {"full_name", "path", "score"} <= set(records[0]["retrieved"][0])
    scores = [p["score"] for p in records[0]["retrieved"]]
    assert scores == sorted(scores, reverse=True)


def test_fisher_agrees_across_world_sizes_and_batch_sizes(trained, workdir, mini_dataset):
    checkpoint, _ = trained
    outputs = {}
    for devices, batch_size in ((1, 4), (2, 3)):
        out = workdir / f"fisher-{devices}.safetensors"
        result = run_cli(
            ["fit", "--config", FISHER, *common(devices), *data_args(mini_dataset), "--trainer.precision=32-true",
             f"--data.batch_size={batch_size}", f"--model.init_args.ckpt_path={checkpoint}", f"--model.init_args.output_path={out}"],
            cwd=workdir,
        )
        assert result.returncode == 0, result.stderr[-4000:]
        for rank in range(devices):
            assert f"rank {rank}/{devices}: barrier 'after_fit' passed" in result.stderr
        outputs[devices] = out
    one, two = load_file(outputs[1]), load_file(outputs[2])
    assert one.keys() == two.keys() and len(one) > 5
    assert any(t.abs().max() > 0 for t in one.values())
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=1e-5 * float(one[name].abs().max()) + 1e-30)
    from safetensors import safe_open

    with safe_open(str(outputs[2]), framework="pt") as f:
        meta = f.metadata()
    assert meta["mode"] == "empirical" and meta["world_size"] == "2"
    assert meta["source_checkpoint"] == str(checkpoint)
    train = json.loads((mini_dataset / "random" / "train.json").read_text())
    assert int(meta["num_examples"]) > len(train)  # pairs: at least one per theorem here, more for multi-premise tactics


def test_resuming_trains_epochs_per_repo_more_epochs(trained, workdir, mini_dataset):
    checkpoint, _ = trained
    first = torch.load(checkpoint, weights_only=True, map_location="cpu")
    result = run_cli(
        ["fit", "--config", RETRIEVAL, *common(1), *data_args(mini_dataset), f"--ckpt_path={checkpoint}", "--progressive.epochs_per_repo=2", "--data.batch_size=4"],
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"progressive training from epoch {first['epoch'] + 1} to max_epochs={first['epoch'] + 3}" in result.stderr
    resumed = torch.load(checkpoint, weights_only=True, map_location="cpu")
    from leanagent.data.datamodule import RetrievalDataModule

    pairs = len(RetrievalDataModule(data_path=str(mini_dataset / "random"), corpus_path=str(mini_dataset / "corpus.jsonl")).train_pairs)
    steps_per_epoch = math.ceil(math.ceil(pairs / 4) / 4)  # one rank, batch 4, accumulate_grad_batches 4
    assert resumed["global_step"] == first["global_step"] + 2 * steps_per_epoch
