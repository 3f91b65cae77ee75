"""End to end, as a user runs it: real subprocesses, 2 CPU ranks over gloo."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from leanagent.data.datamodule import RetrievalDataModule

from tests.conftest import REPO, main_job_model_settings, run_cli, untrained_checkpoint

pytestmark = pytest.mark.slow  # real subprocesses

RETRIEVAL = str(REPO / "configs" / "retrieval.yaml")
FISHER = str(REPO / "configs" / "fisher.yaml")


def data_args(dataset: Path) -> list[str]:
    return [f"--data.data_path={dataset / 'random'}", f"--data.corpus_path={dataset / 'corpus.jsonl'}", "--data.max_seq_len=64"]


def common(devices: int) -> list[str]:
    return ["--trainer.accelerator=cpu", f"--trainer.devices={devices}", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


@pytest.fixture(scope="module")
def workdir(trained_run) -> Path:
    """The shared 2-rank fit's folder (conftest.trained_run): read here, never written."""
    return trained_run[0]


@pytest.fixture(scope="module")
def trained(trained_run) -> tuple[Path, str]:
    # 2 epochs (small_fit_args' epochs_per_repo): the tests below count on it, not on the shipped recipe's.
    folder, stderr = trained_run
    return folder / "checkpoints" / "retrieval" / "last.ckpt", stderr


def validate_in_process(checkpoint: Path, dataset: Path, **data) -> dict[str, float]:
    """One rank, in this process: what `main.py validate` on one device reports, without starting one."""
    import pytorch_lightning as pl

    from leanagent.data.datamodule import RetrievalDataModule
    from leanagent.models.retriever import PremiseRetriever

    model = PremiseRetriever.load_from_checkpoint(checkpoint, map_location="cpu")
    model.num_retrieved = data.pop("num_retrieved", 100)  # retrieval.yaml's
    datamodule = RetrievalDataModule(data_path=str(dataset / "random"), corpus_path=str(dataset / "corpus.jsonl"), max_seq_len=64, **data)
    trainer = pl.Trainer(accelerator="cpu", devices=1, precision="32-true", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    return {k: float(v) for k, v in trainer.validate(model, datamodule=datamodule, verbose=False)[0].items()}


FIT_SMALL = ["--data.batch_size=4", "--trainer.accumulate_grad_batches=1"]  # a dozen optimizer steps


def metrics_rows(run_dir: Path) -> list[dict[str, str]]:
    import csv

    (path,) = sorted(run_dir.glob("lightning_logs/retrieval/version_*/metrics.csv"), key=lambda p: int(p.parent.name[8:]))[-1:]
    return list(csv.DictReader(path.open()))


def logged_lrs(run_dir: Path) -> list[float]:
    rows = metrics_rows(run_dir)
    column = next(c for c in rows[0] if c.startswith("lr-"))
    return [float(r[column]) for r in rows if r.get(column)]


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
    assert "class_path: leanagent.callbacks.checkpoints.ModelCheckpoint" in config
    assert "class_path: pytorch_lightning.strategies.DDPStrategy" in config and "timeout: 364 days, 0:00:00" in config


def test_last_checkpoint_is_the_final_epoch_and_the_lr_decays_over_the_fit(trained, workdir):
    checkpoint, log = trained
    saved = torch.load(checkpoint, weights_only=True, map_location="cpu")
    lrs = logged_lrs(workdir)
    assert saved["epoch"] == 1 and saved["global_step"] == len(lrs) >= 8  # 2 epochs (epochs_per_repo=2), every step
    fit = saved["leanagent_fit"]
    assert (fit["start_epoch"], fit["start_step"], fit["max_epochs"], fit["finished"]) == (0, 0, 2, True)
    settings = main_job_model_settings()
    assert settings["warmup_steps"] == 2
    peak = settings["lr"]
    assert lrs[:3] == pytest.approx([0.0, peak / 2, peak])
    assert lrs[-1] < 0.05 * peak
    assert "this fit trains to max_epochs=2 (progressive training)" in log


def test_given_max_epochs_lr_and_loss_win_over_the_checkpoint(trained, tmp_path, mini_dataset):
    checkpoint, _ = trained
    start = tmp_path / "start.ckpt"
    start.write_bytes(checkpoint.read_bytes())
    result = run_cli(
        ["fit", "--config", RETRIEVAL, *common(1), *data_args(mini_dataset), *FIT_SMALL, f"--ckpt_path={start}",
         "--trainer.max_epochs=4", "--model.init_args.lr=1e-5", "--model.init_args.loss=mse"],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    import yaml

    hparams = yaml.safe_load(next(tmp_path.glob("lightning_logs/retrieval/version_*/hparams.yaml")).read_text())
    assert hparams["lr"] == 1e-5 and hparams["loss"] == "mse"
    resumed = torch.load(tmp_path / "checkpoints" / "retrieval" / "last.ckpt", weights_only=True)
    assert resumed["epoch"] == 3  # epochs 2 and 3: max_epochs=4 as given, not 2 + epochs_per_repo
    lrs = logged_lrs(tmp_path)
    assert max(lrs) == pytest.approx(1e-5) and lrs[-1] < 0.05 * 1e-5 and lrs[0] == 0.0  # this fit's own warmup


def test_the_same_ewc_command_twice_reads_theta_star_from_the_fisher_file(trained, tmp_path, mini_dataset):
    checkpoint, _ = trained
    (tmp_path / "checkpoints" / "retrieval").mkdir(parents=True)
    source = tmp_path / "checkpoints" / "retrieval" / "last.ckpt"  # theta*, which the EWC fit below writes over
    untrained_checkpoint(source, torch.load(checkpoint, weights_only=True)["hyper_parameters"]["model_name"])
    start = tmp_path / "start.ckpt"
    start.write_bytes(checkpoint.read_bytes())
    fisher = run_cli(["fit", "--config", FISHER, *common(1), *data_args(mini_dataset), "--trainer.precision=32-true",
                      f"--model.init_args.ckpt_path={source.relative_to(tmp_path)}", "--model.init_args.output_path=f.safetensors"],
                     cwd=tmp_path)
    assert fisher.returncode == 0, fisher.stderr[-4000:]
    penalties = []
    for run in range(2):
        result = run_cli(
            ["fit", "--config", RETRIEVAL, *common(1), *data_args(mini_dataset), *FIT_SMALL, "--trainer.max_epochs=3",
             "--trainer.limit_train_batches=2",  # a step logs the penalty
             f"--ckpt_path={start}", "--model.init_args.fisher_path=f.safetensors",
             "--model.init_args.ewc_lambda=1000", "--trainer.precision=32-true"],
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr[-4000:]
        rows = metrics_rows(tmp_path)
        penalties.append(float(next(r["ewc_penalty_train_step"] for r in rows if r.get("ewc_penalty_train_step"))))
    assert torch.load(source, weights_only=True)["epoch"] == 2  # the source of theta* was overwritten in between
    assert penalties[0] > 0 and penalties[0] == pytest.approx(penalties[1], rel=1e-6)


def test_leanagent_fisher_on_two_ranks_squares_the_rank_averaged_gradient(trained, tmp_path, mini_dataset):
    from leanagent.data.datamodule import RetrievalDataModule
    from leanagent.models.fisher import FisherInformation

    checkpoint, _ = trained
    out = tmp_path / "leanagent.safetensors"
    result = run_cli(
        ["fit", "--config", FISHER, *common(2), *data_args(mini_dataset), "--trainer.precision=32-true", "--data.batch_size=3",
         "--model.init_args.mode=leanagent", f"--model.init_args.ckpt_path={checkpoint}", f"--model.init_args.output_path={out}"],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    model_name = torch.load(checkpoint, weights_only=True)["hyper_parameters"]["model_name"]
    module = FisherInformation(ckpt_path=str(checkpoint), mode="leanagent", model_name=model_name, max_seq_len=64)
    data = RetrievalDataModule(data_path=str(mini_dataset / "random"), corpus_path=str(mini_dataset / "corpus.jsonl"), max_seq_len=64)
    pairs = data.train_pairs
    n, world, batch = len(pairs), 2, 3
    order = list(range(n)) + list(range(n))[: -n % world or 0]  # DistributedSampler(shuffle=False) pads with the first
    shards = [order[r::world] for r in range(world)]
    expected: dict[str, torch.Tensor] = {}
    for b in range(0, len(shards[0]), batch):
        grads = [module.batch_grads(data.collate_train([pairs[i] for i in shard[b : b + batch]])) for shard in shards]
        for name in grads[0]:
            mean = sum(g[name] for g in grads) / world
            expected[name] = expected.get(name, 0) + mean**2
    written = load_file(out)
    for name, value in expected.items():
        torch.testing.assert_close(written[f"encoder.{name}"], value / n, rtol=1e-4, atol=1e-12)


def test_validate_on_a_split_with_fewer_states_than_ranks(trained, tmp_path, mini_dataset):
    checkpoint, _ = trained
    data = tmp_path / "one"
    (data / "random").mkdir(parents=True)
    (data / "corpus.jsonl").write_bytes((mini_dataset / "corpus.jsonl").read_bytes())
    for split in ("train", "test"):
        (data / "random" / f"{split}.json").write_bytes((mini_dataset / "random" / f"{split}.json").read_bytes())
    val = json.loads((mini_dataset / "random" / "val.json").read_text())
    first = next(t for t in val if t["traced_tactics"])
    first["traced_tactics"] = first["traced_tactics"][:1]
    (data / "random" / "val.json").write_text(json.dumps([first]))
    result = run_cli(["validate", "--config", RETRIEVAL, *common(2), *data_args(data), f"--ckpt_path={checkpoint}",
                      "--trainer.precision=32-true", "--model.init_args.num_retrieved=5"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    two = {k: float(v) for k, v in re.findall(r"│\s+(\S+_val)\s+│\s+([\d.]+)\s+│", result.stdout)}
    one = validate_in_process(checkpoint, data, num_retrieved=5)
    assert two == pytest.approx({k: v for k, v in one.items() if "/" not in k}, rel=1e-6)
    assert two["num_evaluated_val"] == 1.0
    assert "Recall@5_val" in two and "Recall@10_val" not in two  # 5 retrieved: R@10 is not measured


def test_a_reprover_style_config_with_pytorch_lightning_callbacks_trains(tmp_path, mini_dataset):
    import yaml

    config = {
        "trainer": {"max_epochs": 1, "log_every_n_steps": 1,
                    "logger": {"class_path": "pytorch_lightning.loggers.CSVLogger", "init_args": {"save_dir": "logs"}},
                    "callbacks": [
                        {"class_path": "pytorch_lightning.callbacks.LearningRateMonitor", "init_args": {"logging_interval": "step"}},
                        {"class_path": "pytorch_lightning.callbacks.ModelCheckpoint",
                         "init_args": {"dirpath": "ckpt", "monitor": "Recall@10_val", "mode": "max", "save_last": True}}]},
        "model": {"model_name": "byt5-tiny", "lr": 1e-3, "warmup_steps": 2, "num_retrieved": 100},  # no class_path
        "data": {"data_path": str(mini_dataset / "random"), "corpus_path": str(mini_dataset / "corpus.jsonl"),
                 "batch_size": 4, "max_seq_len": 64},
    }
    (tmp_path / "reprover.yaml").write_text(yaml.safe_dump(config))
    result = run_cli(["fit", "--config", "reprover.yaml", *common(1)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)["epoch"] == 0
    assert next(tmp_path.glob("logs/lightning_logs/version_*/metrics.csv")).read_text().count("lr-AdamW") == 1


def test_saved_config_feeds_back_into_the_cli(trained, workdir, tmp_path):
    config = next((workdir / "lightning_logs" / "retrieval").glob("version_*/config.yaml"))
    result = run_cli(["fit", "--config", str(config), "--print_config"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "timeout: 364 days, 0:00:00" in result.stdout


def test_validate_counts_every_example_once_on_two_ranks(trained, tmp_path, mini_dataset):
    checkpoint, _ = trained
    result = run_cli(["validate", "--config", RETRIEVAL, *common(2), *data_args(mini_dataset), f"--ckpt_path={checkpoint}",
                      "--trainer.precision=32-true", "--data.eval_batch_size=5"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    two = {k: float(v) for k, v in re.findall(r"│\s+(\S+_val(?:/\w+)?)\s+│\s+([\d.]+)\s+│", result.stdout)}
    one = validate_in_process(checkpoint, mini_dataset, eval_batch_size=5)
    assert {"Recall@1_val", "Recall@10_val", "MRR_val", "num_evaluated_val", "Recall@10_val/hybrid"} <= set(two)
    states = RetrievalDataModule(data_path=str(mini_dataset / "random"), corpus_path=str(mini_dataset / "corpus.jsonl")).states("val")
    with_positives = sum(1 for positives in states.positives if positives)  # the states that count
    assert two["num_evaluated_val"] == with_positives and len(states) > 5 * 2  # several batches per rank, an uneven last
    assert two == pytest.approx(one, rel=1e-4)


def test_predict_writes_one_line_per_tactic_state_from_all_ranks(trained, tmp_path, mini_dataset):
    checkpoint, _ = trained
    workdir = tmp_path
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


def test_fisher_agrees_across_world_sizes_and_batch_sizes(trained, tmp_path, mini_dataset):
    checkpoint, _ = trained
    workdir = tmp_path
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


def test_resuming_trains_epochs_per_repo_more_epochs(trained, tmp_path, mini_dataset):
    shared, _ = trained
    workdir = tmp_path
    checkpoint = workdir / "checkpoints" / "retrieval" / "last.ckpt"  # a copy where this fit writes its own
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(shared.read_bytes())
    first = torch.load(checkpoint, weights_only=True, map_location="cpu")
    result = run_cli(
        ["fit", "--config", RETRIEVAL, *common(1), *data_args(mini_dataset), f"--ckpt_path={checkpoint}", "--progressive.epochs_per_repo=2", *FIT_SMALL],
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"progressive training from epoch {first['epoch'] + 1} to max_epochs={first['epoch'] + 3}" in result.stderr
    resumed = torch.load(checkpoint, weights_only=True, map_location="cpu")
    from leanagent.data.datamodule import RetrievalDataModule

    pairs = len(RetrievalDataModule(data_path=str(mini_dataset / "random"), corpus_path=str(mini_dataset / "corpus.jsonl")).train_pairs)
    steps_per_epoch = math.ceil(pairs / 4)  # one rank, batch 4, accumulate_grad_batches 1
    assert resumed["global_step"] == first["global_step"] + 2 * steps_per_epoch
    assert logged_lrs(workdir)[-1] < 0.05 * 2.0e-3  # the resumed fit's own schedule has decayed too
