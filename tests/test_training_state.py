"""A run's state decided in one place: epoch budget, LR schedule, last.ckpt, settings against checkpoint hparams."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch
from jsonargparse import Namespace

from leanagent.callbacks.checkpoints import ModelCheckpoint
from leanagent.callbacks.progressive import first_epoch, plan_max_epochs
from leanagent.checkpoint_files import FIT_STATE_KEY, load_checkpoint, next_fit_start
from leanagent.cli import LeanAgentCLI, adopt_checkpoint_hparams
from leanagent.cli_config import check_some_epoch_validated, use_final_last_checkpoint
from leanagent.errors import LeanAgentError
from leanagent.models.fit_checkpoint import fit_state_entry
from leanagent.models.schedule import warmup_cosine
from tests.conftest import REPO


def checkpoint(epoch: int, step: int, **state) -> dict:
    ckpt = {"epoch": epoch, "global_step": step, "state_dict": {}}
    if state:
        ckpt[FIT_STATE_KEY] = {"start_epoch": 0, "start_step": 0, "max_epochs": 3, "finished": True, **state}
    return ckpt


def test_epoch_budget_fresh_resumed_interrupted_and_explicit():
    assert plan_max_epochs(None, None, 3) == 3
    assert plan_max_epochs(checkpoint(2, 30, finished=True), None, 2) == 5  # epochs 0-2 done, 2 more
    assert plan_max_epochs(checkpoint(1, 17, finished=False, max_epochs=3), None, 2) == 3  # finish the plan
    assert plan_max_epochs(checkpoint(4, 50), None, 1) == 6  # a checkpoint from elsewhere counts as finished
    assert plan_max_epochs(None, 1, 3) == 1
    assert plan_max_epochs(checkpoint(2, 30, finished=True), 7, 1) == 7
    with pytest.raises(LeanAgentError, match="already trained 3 epoch"):
        plan_max_epochs(checkpoint(2, 30, finished=True), 3, 1)


def test_a_fit_whose_epochs_all_fall_between_validations_is_refused_while_callbacks_monitor_them():
    def config(every: int | None, monitor: str = "Recall@10_val") -> Namespace:
        callback = Namespace(class_path="pytorch_lightning.callbacks.EarlyStopping", init_args=Namespace(monitor=monitor))
        return Namespace(trainer=Namespace(check_val_every_n_epoch=every, callbacks=[callback]))

    # Lightning validates epoch e (from 0) when e + 1 is a multiple of check_val_every_n_epoch.
    for every, start, max_epochs in ((3, 0, 3), (2, 0, 3), (1, 5, 6), (None, 0, 1), (4, 3, 4), (3, 0, -1)):
        check_some_epoch_validated(config(every), start, max_epochs)
    check_some_epoch_validated(config(5, monitor="loss"), 0, 3)  # nothing needs validation
    for every, start, max_epochs, epochs in ((4, 0, 3, "epochs 0 to 2"), (3, 3, 5, "epochs 3 to 4"), (2, 2, 3, "epoch 2")):
        with pytest.raises(LeanAgentError, match=f"is {every}, so this fit, which trains {epochs} \\(from 0\\), validates none"
                                                 f".*EarlyStopping monitors Recall@10_val.*at most {max_epochs - start}"):
            check_some_epoch_validated(config(every), start, max_epochs)
    # A resumed fit starts in the epoch it was interrupted in, or after the one a finished fit ended with.
    assert first_epoch(None) == 0
    assert first_epoch(checkpoint(1, 17, finished=False, max_epochs=3)) == 1
    assert first_epoch(checkpoint(2, 30, finished=True)) == 3


def test_no_epoch_limit_is_kept_when_max_steps_ends_the_fit_and_refused_when_nothing_does():
    # Lightning's max_epochs=-1: the fit runs until max_steps, not progressive training's epochs.
    assert plan_max_epochs(None, -1, 3, max_steps=40) == -1
    assert plan_max_epochs(checkpoint(2, 30, finished=True), -1, 1, max_steps=90) == -1
    # An interrupted fit without an epoch limit continues to its max_steps.
    assert plan_max_epochs(checkpoint(1, 17, finished=False, max_epochs=-1), None, 2, max_steps=40) == -1
    assert plan_max_epochs(None, None, 3, max_steps=40) == 3  # unset still means progressive training
    interrupted = checkpoint(1, 17, finished=False, max_epochs=-1)
    for args, whose in (((None, -1, 3), "trainer.max_epochs is -1"), ((interrupted, None, 2), "checkpoint interrupted")):
        with pytest.raises(LeanAgentError, match=f"{whose}.*no end.*give trainer.max_steps"):
            plan_max_epochs(*args, max_steps=-1)
    assert plan_max_epochs(None, -5, 3) == -5  # left for Lightning to refuse by name


def test_a_fit_that_reached_max_steps_is_finished_even_mid_epoch():
    """The next fit then plans afresh; continuing a plan whose max_steps was reached would train past it."""
    def trainer(global_step: int, last_batch: bool = False) -> SimpleNamespace:
        progress = SimpleNamespace(is_last_batch=last_batch, current=SimpleNamespace(processed=5))
        return SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)),
                               max_epochs=-1, max_steps=40, global_step=global_step, current_epoch=2, should_stop=False, world_size=1)

    assert fit_state_entry(trainer(40), 0, 0)["finished"] is True
    assert fit_state_entry(trainer(39), 0, 0)["finished"] is False  # preempted before its end
    assert fit_state_entry(trainer(39, last_batch=True), 0, 0)["finished"] is False  # no epoch limit to reach


def test_next_fit_starts_where_the_last_one_ended_or_continues_an_interrupted_one():
    assert next_fit_start(checkpoint(2, 30, finished=True)) == (3, 30)
    assert next_fit_start(checkpoint(1, 17, finished=False, start_epoch=0, start_step=0)) == (0, 0)
    assert next_fit_start({"epoch": 4, "global_step": 9, "state_dict": {}}) == (5, 9)


def test_schedule_warms_up_then_decays_to_near_zero_at_the_last_step_of_each_fit():
    peak_fraction = warmup_cosine(warmup_steps=4, total_steps=40)
    assert [peak_fraction(s) for s in range(4)] == pytest.approx([0.0, 0.25, 0.5, 0.75])
    assert peak_fraction(4) == pytest.approx(1.0)
    assert peak_fraction(39) < 0.05
    resumed = warmup_cosine(warmup_steps=4, total_steps=40, start_step=100)  # the next fit of a progressive run
    assert resumed(101) == pytest.approx(0.25) and resumed(139) < 0.05


def test_checkpoint_loading_refuses_junk_and_pickles_with_one_error(tmp_path):
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(LeanAgentError, match="not a loadable weights-only checkpoint"):
        load_checkpoint(junk)

    class Payload:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "ran",))

    torch.save({"state_dict": {}, "x": Payload()}, tmp_path / "pickle.ckpt")
    with pytest.raises(LeanAgentError, match="not a loadable weights-only checkpoint"):
        load_checkpoint(tmp_path / "pickle.ckpt")
    assert not (tmp_path / "ran").exists()
    with pytest.raises(LeanAgentError, match="is a folder"):
        load_checkpoint(tmp_path)

    # A real checkpoint cut short (an interrupted copy): torch's memory map fails with an OSError.
    torch.save({"state_dict": {"w": torch.zeros(4096)}}, tmp_path / "whole.ckpt")
    (tmp_path / "cut.ckpt").write_bytes((tmp_path / "whole.ckpt").read_bytes()[:5000])
    with pytest.raises(LeanAgentError, match=r"cut.ckpt is not a loadable weights-only checkpoint \(OSError"):
        load_checkpoint(tmp_path / "cut.ckpt")


class FallingMetric(pl.LightningModule):
    """Its monitored score falls every epoch, so the best checkpoint is epoch 0's."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("score", -float(self.current_epoch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=2)

    val_dataloader = train_dataloader


def test_last_checkpoint_holds_the_final_epoch_when_the_best_is_earlier(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="score", mode="max", save_last=True, filename="{epoch}")
    trainer = pl.Trainer(
        max_epochs=3, callbacks=[callback], logger=False, enable_progress_bar=False, enable_model_summary=False,
        accelerator="cpu", num_sanity_val_steps=0,
    )
    trainer.fit(FallingMetric())
    last = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert last["epoch"] == 2 and last["global_step"] == trainer.global_step == 12
    assert Path(callback.best_model_path).name == "epoch=0.ckpt"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # written under a temp name, renamed


def test_lightning_model_checkpoint_in_a_config_runs_as_ours():
    config = Namespace(trainer=Namespace(callbacks=[
        Namespace(class_path="pytorch_lightning.callbacks.ModelCheckpoint", init_args=Namespace(save_last=True)),
        Namespace(class_path="pytorch_lightning.callbacks.LearningRateMonitor", init_args=Namespace()),
    ]))
    use_final_last_checkpoint(config)
    assert [c.class_path for c in config.trainer.callbacks] == [
        "leanagent.callbacks.checkpoints.ModelCheckpoint", "pytorch_lightning.callbacks.LearningRateMonitor"]


def test_explicit_settings_come_from_the_command_line_and_config_files(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  class_path: leanagent.models.retriever.PremiseRetriever\n  init_args:\n    lr: 0.1\n    loss: mse\n")
    reprover = tmp_path / "r.yaml"
    reprover.write_text("model:\n  model_name: byt5-tiny\n  warmup_steps: 5\n")
    argv = ["--config", str(config), f"--config={reprover}", "--model.init_args.num_retrieved=5", "--model.weight_decay", "0.1",
            "--trainer.accelerator=cpu", "--trainer.devices=1"]
    cli = LeanAgentCLI(args=argv, run=False)
    assert cli.explicit_model_keys(None) == {"lr", "loss", "model_name", "warmup_steps", "num_retrieved", "weight_decay"}
    assert cli.config.model.init_args.max_seq_len == 512  # a default, not given: the checkpoint's would win


@pytest.mark.parametrize("given, seed", [([], 3407), (["--seed_everything=7"], 7), (["--seed_everything=7", "--data.seed=5"], 5),
                                         (["--seed_everything=true"], 3407), (["--seed_everything=false"], 3407)])
def test_the_run_seed_drives_negatives_and_order_unless_data_seed_is_given(given, seed):
    # The shipped encoders have no dropout: with a fixed data seed, another seed_everything changed nothing.
    # `true` draws a seed in each process (ranks under torchrun would not share it), so the data keeps 3407.
    argv = ["--config", str(REPO / "configs" / "retrieval.yaml"), "--trainer.accelerator=cpu", "--trainer.devices=1", *given]
    cli = LeanAgentCLI(args=argv, run=False)
    assert cli.datamodule.seed == seed


def retriever_config(**init_args) -> Namespace:
    defaults = dict(model_name="byt5-tiny", lr=1e-4, loss="mse", warmup_steps=2000, max_seq_len=512)
    return Namespace(
        model=Namespace(class_path="leanagent.models.retriever.PremiseRetriever", init_args=Namespace(**{**defaults, **init_args})),
        data=Namespace(model_name=init_args.get("model_name", "byt5-tiny")),
    )


def test_what_the_user_gave_wins_and_the_rest_comes_from_the_checkpoint():
    saved = {"hyper_parameters": {"_class_path": "leanagent.models.retriever.PremiseRetriever", "model_name": "byt5-tiny",
                                  "lr": 2e-3, "loss": "infonce", "warmup_steps": 2, "max_seq_len": 64}}
    config = retriever_config(lr=1e-5, loss="mse")
    adopted = adopt_checkpoint_hparams(config, saved, explicit={"lr", "loss"})
    assert config.model.init_args.lr == 1e-5 and config.model.init_args.loss == "mse"  # given: kept
    assert config.model.init_args.warmup_steps == 2 and adopted == {"warmup_steps": 2}  # not given: checkpoint's
    assert config.model.init_args.max_seq_len == 512  # linked from data.max_seq_len, never from a checkpoint


def test_another_architecture_is_refused_in_one_line():
    saved = {"hyper_parameters": {"model_name": "byt5-mini"}}
    with pytest.raises(LeanAgentError, match="trained with model_name 'byt5-mini'.*'byt5-tiny'"):
        adopt_checkpoint_hparams(retriever_config(), saved, explicit={"model_name"})
    config = retriever_config()
    adopt_checkpoint_hparams(config, saved, explicit=set())
    assert config.model.init_args.model_name == config.data.model_name == "byt5-mini"


def test_a_new_fit_from_a_finished_one_forgets_early_stopping_state(toy_dataset, tmp_path):
    """A lifelong stage (or progressive training) starts from the checkpoint of a finished fit. Lightning would
    restore EarlyStopping's best score, wait count and patience from it, and stop the new fit after one epoch
    because the earlier fit (another repository) scored higher; it must train its whole plan."""
    from pytorch_lightning.callbacks import EarlyStopping

    from leanagent.data.datamodule import RetrievalDataModule
    from leanagent.models.retriever import PremiseRetriever

    def fit(max_epochs: int, ckpt_path: Path | None = None) -> pl.Trainer:
        pl.seed_everything(0)
        model = PremiseRetriever(model_name="byt5-tiny", max_seq_len=32, num_retrieved=10, warmup_steps=0)
        data = RetrievalDataModule(data_path=str(toy_dataset / "random"), corpus_path=str(toy_dataset / "corpus.jsonl"),
                                   max_seq_len=32, batch_size=4, num_hard_negatives=0)
        stop = EarlyStopping(monitor="Recall@10_val", mode="max", patience=2)
        checkpoints = ModelCheckpoint(dirpath=tmp_path / f"fit{max_epochs}", save_last=True, monitor="Recall@10_val", mode="max")
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=max_epochs, logger=False,
                             enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                             callbacks=[stop, checkpoints], default_root_dir=tmp_path)
        trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
        return trainer

    fit(1)
    path = tmp_path / "fit1" / "last.ckpt"
    saved = torch.load(path, weights_only=True)
    assert saved[FIT_STATE_KEY]["finished"] is True
    (key,) = [k for k in saved["callbacks"] if k.startswith("EarlyStopping")]
    # The earlier fit: a score no later epoch reaches, patience almost spent, and a patience of 1.
    saved["callbacks"][key].update(best_score=torch.tensor(1000.0), wait_count=0, patience=1)
    torch.save(saved, path)

    second = fit(4, path)  # epochs 1, 2, 3
    assert second.current_epoch == 4


@pytest.mark.parametrize("other_data", [True, False])
def test_a_fit_on_other_validation_data_records_a_best_of_its_own(toy_dataset, tmp_path, other_data):
    """The next repository of a lifelong run resumes from the last one's best.ckpt, whose ModelCheckpoint state
    holds that repository's best Recall@10_val: unless selection starts afresh on the new validation data, a lower
    score there never records a best, and the stage hands over its last epoch instead of its best."""
    from leanagent.callbacks.progressive import ProgressiveTraining
    from leanagent.data.datamodule import RetrievalDataModule
    from leanagent.models.retriever import PremiseRetriever

    def fit(folder: str, max_epochs: int, ckpt_path: Path | None = None) -> ModelCheckpoint:
        pl.seed_everything(0)
        model = PremiseRetriever(model_name="byt5-tiny", max_seq_len=32, num_retrieved=10, warmup_steps=0)
        data = RetrievalDataModule(data_path=str(toy_dataset / "random"), corpus_path=str(toy_dataset / "corpus.jsonl"),
                                   max_seq_len=32, batch_size=4, num_hard_negatives=0)
        checkpoints = ModelCheckpoint(dirpath=tmp_path / folder, save_last=True, monitor="Recall@10_val", mode="max")
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=max_epochs, logger=False,
                             enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                             callbacks=[ProgressiveTraining(), checkpoints], default_root_dir=tmp_path)
        trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
        return checkpoints

    first = fit("first", 1)
    path = Path(first.best_model_path)
    saved = torch.load(path, weights_only=True)
    assert saved["callbacks"]["ProgressiveTraining"]["validation_key"]
    (key,) = [k for k in saved["callbacks"] if k.startswith("ModelCheckpoint")]
    saved["callbacks"][key]["best_model_score"] = torch.tensor(1000.0)  # a score no epoch here reaches
    saved["callbacks"][key]["kth_value"] = torch.tensor(1000.0)
    if other_data:  # as if validated on another repository
        saved["callbacks"]["ProgressiveTraining"]["validation_key"] = "another repository"
    torch.save(saved, path)

    second = fit("first", 3, path)
    if other_data:
        assert second.best_model_score is not None and float(second.best_model_score) < 1000.0
        assert Path(second.best_model_path) != path and Path(second.best_model_path).is_file()
    else:  # the same validation data: the best so far still stands (progressive training on one dataset)
        assert float(second.best_model_score) == 1000.0 and Path(second.best_model_path) == path


def test_a_fit_with_dropout_stopped_mid_epoch_and_resumed_equals_an_uninterrupted_fit(toy_dataset, tmp_path):
    """Dropout draws from the global RNG, which Lightning neither saves nor restores: a resumed fit must still
    draw the masks the uninterrupted fit drew at the same batch (in one process: Preempted is caught here)."""
    from leanagent.callbacks.preemption import Preempted, PreemptionCheckpoint
    from leanagent.data.datamodule import RetrievalDataModule
    from leanagent.models.retriever import PremiseRetriever
    from tests.helpers import Dropout, SignalAtStep

    def fit(folder: str, ckpt_path: str | None = None, stop_at: int | None = None, batch_size: int = 1) -> dict:
        pl.seed_everything(7)
        model = PremiseRetriever(model_name="byt5-tiny", max_seq_len=32, num_retrieved=10, warmup_steps=1, lr=1e-2)
        data = RetrievalDataModule(data_path=str(toy_dataset / "random"), corpus_path=str(toy_dataset / "corpus.jsonl"),
                                   max_seq_len=32, batch_size=batch_size, num_hard_negatives=0)
        callbacks = [Dropout(0.3), PreemptionCheckpoint(), ModelCheckpoint(dirpath=tmp_path / folder, save_last=True)]
        if stop_at is not None:
            callbacks.append(SignalAtStep(step=stop_at))
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, limit_val_batches=0,
                             enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
        trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
        return torch.load(tmp_path / folder / "last.ckpt", weights_only=True)

    expected = fit("straight")
    assert expected["global_step"] == 8  # 4 pairs, 2 epochs
    with pytest.raises(Preempted):
        fit("stopped", stop_at=5)  # in the middle of epoch 1
    assert torch.load(tmp_path / "stopped" / "last.ckpt", weights_only=True)["global_step"] == 6
    # Another batch size would skip 2 batches of 2 of the shuffled epoch: pairs never trained on.
    with pytest.raises(LeanAgentError, match="2 batches into epoch 1 with data.batch_size=1 on 1 rank.*has data.batch_size=2"):
        fit("stopped", ckpt_path=str(tmp_path / "stopped" / "last.ckpt"), batch_size=2)
    final = fit("stopped", ckpt_path=str(tmp_path / "stopped" / "last.ckpt"))
    assert final["global_step"] == 8
    for name, tensor in expected["state_dict"].items():
        torch.testing.assert_close(final["state_dict"][name], tensor, rtol=0, atol=1e-6)


def test_a_fit_resumed_by_steps_from_an_epochs_end_trains_and_logs_what_one_resumed_by_epochs_does(toy_dataset, tmp_path):
    """A checkpoint saved at an epoch's end, resumed with trainer.max_steps: Lightning restarts on that epoch's
    end and runs its end hooks again, where EarlyStopping found no validation metric and stopped the fit with a
    traceback (`main.py fit ... --trainer.max_steps=N --ckpt_path .../last.ckpt`)."""
    from pytorch_lightning.callbacks import EarlyStopping, LearningRateMonitor
    from pytorch_lightning.loggers import CSVLogger

    from leanagent.callbacks.progressive import ProgressiveTraining
    from leanagent.data.datamodule import RetrievalDataModule
    from leanagent.models.retriever import PremiseRetriever

    def fit(name: str, ckpt_path: Path | None = None, **limits) -> Path:
        pl.seed_everything(0)
        model = PremiseRetriever(model_name="byt5-tiny", max_seq_len=32, num_retrieved=10, warmup_steps=1, lr=1e-2)
        data = RetrievalDataModule(data_path=str(toy_dataset / "random"), corpus_path=str(toy_dataset / "corpus.jsonl"),
                                   max_seq_len=32, batch_size=1, num_hard_negatives=0)
        callbacks = [EarlyStopping(monitor="Recall@10_val", mode="max", patience=5), ProgressiveTraining(), LearningRateMonitor(),
                     ModelCheckpoint(dirpath=tmp_path / name, save_last=True, monitor="Recall@10_val", mode="max")]
        trainer = pl.Trainer(accelerator="cpu", devices=1, logger=CSVLogger(tmp_path / "logs", name=name, version=0), log_every_n_steps=1,
                             enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                             callbacks=callbacks, **limits)
        trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
        return tmp_path / name / "last.ckpt"

    start = fit("start", max_epochs=1)  # 4 pairs: 4 steps
    by_epochs = torch.load(fit("by_epochs", start, max_epochs=3), weights_only=True)
    by_steps = torch.load(fit("by_steps", start, max_steps=12), weights_only=True)
    assert (by_steps["epoch"], by_steps["global_step"]) == (by_epochs["epoch"], by_epochs["global_step"]) == (2, 12)
    for name, tensor in by_epochs["state_dict"].items():
        torch.testing.assert_close(by_steps["state_dict"][name], tensor, rtol=0, atol=0)
    assert by_steps["loops"] == by_epochs["loops"]
    logged = [(tmp_path / "logs" / name / "version_0" / "metrics.csv").read_text() for name in ("by_epochs", "by_steps")]
    assert logged[0] == logged[1]
    with open(tmp_path / "logs" / "by_steps" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["step"] for r in rows if r["Recall@10_val"]] == ["7", "11"]
    assert [r["step"] for r in rows if r["lr-AdamW"]] == [str(step) for step in range(4, 12)]


def test_a_rerun_in_a_folder_with_checkpoints_says_once_what_it_does(toy_dataset, tmp_path, recwarn):
    import logging

    from leanagent.data.datamodule import RetrievalDataModule
    from leanagent.models.retriever import PremiseRetriever

    def fit(ckpt_path: Path | None = None) -> None:
        model = PremiseRetriever(model_name="byt5-tiny", max_seq_len=32, num_retrieved=10, warmup_steps=0)
        data = RetrievalDataModule(data_path=str(toy_dataset / "random"), corpus_path=str(toy_dataset / "corpus.jsonl"),
                                   max_seq_len=32, batch_size=4, num_hard_negatives=0)
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1 if ckpt_path is None else 2, logger=False,
                             limit_val_batches=0, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpts", save_last=True)])
        trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("leanagent")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)  # as the CLI sets it
    try:
        fit()
        assert not [r for r in records if "earlier fit" in r.getMessage()]
        fit()
        fit(tmp_path / "ckpts" / "last.ckpt")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    said = [r.getMessage() for r in records if "earlier fit" in r.getMessage()]
    assert len(said) == 2 and "starts afresh" in said[0] and "last.ckpt" in said[0]
    assert f"resumes from {tmp_path / 'ckpts' / 'last.ckpt'}" in said[1], said[1]
    assert not [w for w in recwarn if "exists and is not empty" in str(w.message)]


def test_only_an_unfinished_fit_saved_mid_epoch_needs_its_batch_size_and_ranks_back():
    """A fit that ended at max_steps mid-epoch is finished: the next fit starts the next epoch and skips nothing."""
    from pytorch_lightning.trainer.states import TrainerFn

    from leanagent.checkpoint_files import FIT_STATE_KEY
    from leanagent.models.fit_checkpoint import resume_position

    def saved(finished: bool, epoch_done: bool) -> dict:
        return {FIT_STATE_KEY: {"epoch": 1, "batches_done": 5, "finished": finished, "epoch_done": epoch_done,
                                "batch_size": 4, "world_size": 2}}

    def trainer(batch_size: int, world_size: int) -> SimpleNamespace:
        return SimpleNamespace(state=SimpleNamespace(fn=TrainerFn.FITTING), datamodule=SimpleNamespace(batch_size=batch_size),
                               world_size=world_size, ckpt_path="last.ckpt")

    assert resume_position(saved(False, False), trainer(4, 2)) == (1, 5)
    for other in (trainer(8, 2), trainer(4, 1)):
        with pytest.raises(LeanAgentError, match="--ckpt_path last.ckpt was saved 5 batches into epoch 1 with data.batch_size=4 on 2"):
            resume_position(saved(False, False), other)
        assert resume_position(saved(True, False), other) == (1, 5)  # finished at max_steps
        assert resume_position(saved(False, True), other) == (1, 5)  # at the epoch's end
        assert resume_position({FIT_STATE_KEY: {"epoch": 1, "batches_done": 5}}, other) == (1, 5)  # an older checkpoint
