"""The private Lightning, lightning_fabric, torch and jsonargparse names leanagent relies on (leanagent/compat.py).

Each test names the private API in its failure message, so that an upgrade which removes or changes
one says which, and where to look (docs/private_apis.md), instead of a hang in a long run.
"""

from __future__ import annotations

import inspect
import platform
from datetime import timedelta

import pytest
import pytorch_lightning as pl
import torch

from leanagent import compat


def require(condition: bool, private: str, what: str) -> None:
    if not condition:
        pytest.fail(f"private API changed: {private}: {what} (see leanagent/compat.py and docs/private_apis.md)", pytrace=False)


class TinyModule(pl.LightningModule):
    def __init__(self, width: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(width, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)), batch_size=2)


def tiny_trainer(tmp_path, **kwargs) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp_path, **kwargs)


# Lightning and lightning_fabric.
def test_launch_process_observer_is_what_the_launcher_calls(monkeypatch):
    from pytorch_lightning.strategies.launchers import subprocess_script

    private = "pytorch_lightning.strategies.launchers.subprocess_script._launch_process_observer"
    require(hasattr(subprocess_script, "_launch_process_observer"), private, "no longer exists")
    launch = inspect.getsource(subprocess_script._SubprocessScriptLauncher.launch)
    require("_launch_process_observer(self.procs)" in launch, private, "_SubprocessScriptLauncher.launch no longer calls it with self.procs")
    monkeypatch.setattr(subprocess_script, "_launch_process_observer", subprocess_script._launch_process_observer)
    seen: list = []
    compat.replace_child_process_observer(seen.append)
    compat.replace_child_process_observer(seen.append)  # idempotent
    subprocess_script._launch_process_observer(["children"])
    require(seen == [["children"]], private, "the replacement was not called once with the children")


def test_cluster_environment_is_the_one_lightnings_signal_handling_reads(tmp_path):
    from lightning_fabric.plugins.environments import SLURMEnvironment
    from pytorch_lightning.trainer.connectors import signal_connector

    private = "Trainer._accelerator_connector.cluster_environment"
    require(private.split(".", 1)[1] in inspect.getsource(signal_connector._SignalConnector.register_signal_handlers), private,
            "Lightning's signal handling no longer decides on it, so PreemptionCheckpoint may disagree with it")
    environment = SLURMEnvironment(auto_requeue=False)
    trainer = tiny_trainer(tmp_path, plugins=[environment])
    require(compat.cluster_environment(trainer) is environment, private, "does not hold the environment given to the Trainer")


def test_lightnings_sigterm_handler_is_replaced_by_one_without_a_collective(tmp_path, monkeypatch):
    from pytorch_lightning.trainer.connectors import signal_connector

    private = "pytorch_lightning.trainer.connectors.signal_connector._SignalConnector._sigterm_notifier_fn"
    connector = signal_connector._SignalConnector
    original = getattr(connector, "_sigterm_notifier_fn", None)
    original = getattr(original, "_lightnings", original)  # Lightning's, if main() in this process replaced it
    require(original is not None and list(inspect.signature(original).parameters) == ["self", "signum", "_"], private,
            "is gone or takes other arguments")
    require("self._sigterm_notifier_fn" in inspect.getsource(connector.register_signal_handlers), private,
            "register_signal_handlers no longer installs it")
    monkeypatch.setattr(connector, "_sigterm_notifier_fn", original)  # undone after the test
    compat.sigterm_handler_without_collectives()
    compat.sigterm_handler_without_collectives()  # idempotent
    kills: list[int] = []

    class Launcher:
        def kill(self, signum: int) -> None:
            kills.append(signum)

    trainer = tiny_trainer(tmp_path)
    trainer.strategy._launcher = Launcher()
    collectives: list[str] = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "broadcast", lambda *a, **k: collectives.append("broadcast"))
    monkeypatch.setattr(type(trainer), "world_size", property(lambda self: 2))
    handler = trainer._signal_connector._sigterm_notifier_fn
    handler(15, None)
    handler(15, None)
    require(collectives == [], private, "the replacement still runs a collective")
    require(kills == [15] and trainer._signal_connector.received_sigterm, private,
            "the replacement no longer forwards the signal once or no longer sets the flag")
    monkeypatch.setattr(connector, "_sigterm_notifier_fn", original)
    original(trainer._signal_connector, 15, None)
    require(collectives == ["broadcast"], private, "Lightning's handler no longer runs a broadcast: the replacement may go")


def test_save_last_checkpoint_writes_last_ckpt_now(tmp_path):
    from pytorch_lightning.callbacks import ModelCheckpoint

    private = "ModelCheckpoint._save_last_checkpoint(trainer, ModelCheckpoint._monitor_candidates(trainer))"
    for name, parameters in (("_save_last_checkpoint", ["self", "trainer", "monitor_candidates"]), ("_monitor_candidates", ["self", "trainer"])):
        method = getattr(ModelCheckpoint, name, None)
        require(method is not None, private, f"ModelCheckpoint.{name} no longer exists")
        require(list(inspect.signature(method).parameters) == parameters, private, f"ModelCheckpoint.{name} takes other arguments")
    callback = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=0)
    trainer = tiny_trainer(tmp_path, max_steps=1, callbacks=[callback])
    trainer.fit(TinyModule())
    (tmp_path / "ckpt" / "last.ckpt").unlink(missing_ok=True)
    callback.last_model_path = ""
    compat.save_last_checkpoint(callback, trainer)
    require((tmp_path / "ckpt" / "last.ckpt").is_file(), private, "wrote no last.ckpt")
    require(callback.last_model_path == str(tmp_path / "ckpt" / "last.ckpt"), private, "did not set last_model_path")


class ValidatedModule(TinyModule):
    def validation_step(self, batch, batch_idx):
        self.log("loss_val", self.layer(batch[0]).pow(2).mean())

    def val_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(2, 2)), batch_size=2)


def test_an_epoch_end_checkpoints_loop_state_is_the_one_close_saved_epoch_reads(tmp_path):
    """The behaviour (a fit resumed by steps from it trains and logs what one resumed by epochs does) is checked in
    tests/test_training_state.py; here, the saved layout and Lightning's extra stepped batch on such a restart."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    private = 'checkpoint["loops"]["fit_loop"] progress trackers and "epoch_loop.state_dict"["_batches_that_stepped"]'
    trainer = tiny_trainer(tmp_path, max_epochs=1, callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)])
    trainer.fit(ValidatedModule())
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    fit = saved["loops"]["fit_loop"]
    require(fit["epoch_progress"]["current"] == {"ready": 1, "started": 1, "processed": 1, "completed": 0}, private,
            f"an epoch-end checkpoint's epoch progress is now {fit['epoch_progress']['current']}")
    require(fit["epoch_loop.state_dict"].get("_batches_that_stepped") == 2, private, "the stepped-batch count moved")
    require(compat.close_saved_epoch(saved) == 2, private, "the layout was not recognised")
    require(fit["epoch_progress"]["current"]["completed"] == 1 and fit["epoch_loop.batch_progress"]["is_last_batch"] is False,
            private, "the saved state was not changed")
    torch.save(saved, tmp_path / "closed.ckpt")
    seen = []

    class Hold(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            if not seen:
                compat.hold_batches_that_stepped(trainer, 2)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if not seen:
                seen.append(compat.batches_that_stepped(trainer))

    resumed = tiny_trainer(tmp_path, max_steps=4, callbacks=[Hold()])  # one more epoch of 2 steps
    resumed.fit(ValidatedModule(), ckpt_path=tmp_path / "closed.ckpt")
    require((resumed.current_epoch, resumed.global_step) == (2, 4), private, "the resumed fit did not train the next epoch")
    require(seen == [2], private, f"the first resumed batch logs at step {seen}, not the checkpoint's 2")
    require(compat.batches_that_stepped(resumed) == 4, private, "the count no longer follows the steps")


def test_model_checkpoint_writes_every_file_through_save_checkpoint(tmp_path, monkeypatch):
    """leanagent.callbacks.checkpoints.ModelCheckpoint overrides the private `_save_checkpoint` hook and sets
    `_last_checkpoint_saved` (compat.record_checkpoint_saved); both must still mean what they meant."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    private = "ModelCheckpoint._save_checkpoint(trainer, filepath) / ModelCheckpoint._last_checkpoint_saved"
    method = getattr(ModelCheckpoint, "_save_checkpoint", None)
    require(method is not None and list(inspect.signature(method).parameters) == ["self", "trainer", "filepath"], private,
            "the hook is gone or takes other arguments")
    written: list[str] = []
    original = ModelCheckpoint._save_checkpoint

    def spy(self, trainer, filepath):
        written.append(filepath)
        original(self, trainer, filepath)

    monkeypatch.setattr(ModelCheckpoint, "_save_checkpoint", spy)
    callback = ModelCheckpoint(dirpath=tmp_path, save_last=True, filename="best")
    trainer = tiny_trainer(tmp_path, max_epochs=1, callbacks=[callback])
    trainer.fit(TinyModule())
    require(sorted(written) == sorted([str(tmp_path / "best.ckpt"), str(tmp_path / "last.ckpt")]), private,
            f"best and last were not both written through it (saw {written})")
    require(callback._last_checkpoint_saved == str(tmp_path / "last.ckpt"), private, "no longer records the file last written")
    compat.record_checkpoint_saved(callback, "elsewhere.ckpt")
    require(callback._last_checkpoint_saved == "elsewhere.ckpt", private, "cannot be set")


def test_lightning_cli_parses_the_checkpoint_path_after_the_arguments():
    """cli.py overrides `LightningCLI._parse_ckpt_path`, which must run right after `parse_arguments`."""
    from pytorch_lightning.cli import LightningCLI

    private = "LightningCLI._parse_ckpt_path"
    require(callable(getattr(LightningCLI, "_parse_ckpt_path", None)), private, "no longer exists")
    require(list(inspect.signature(LightningCLI._parse_ckpt_path).parameters) == ["self"], private, "takes arguments now")
    calls: list[str] = []

    class Recording(LightningCLI):
        def parse_arguments(self, parser, args):
            super().parse_arguments(parser, args)
            calls.append("parse_arguments")

        def _parse_ckpt_path(self):
            calls.append("_parse_ckpt_path" if self.config.get("fit") is not None else "_parse_ckpt_path without a config")

        def before_instantiate_classes(self):
            calls.append("before_instantiate_classes")
            raise SystemExit(0)  # nothing more is needed

    with pytest.raises(SystemExit):
        Recording(TinyModule, args=["fit", "--trainer.logger=false"])
    require(calls == ["parse_arguments", "_parse_ckpt_path", "before_instantiate_classes"], private,
            f"LightningCLI.__init__ calls {calls}, not parse_arguments, _parse_ckpt_path, before_instantiate_classes")


def test_lightning_cli_records_the_model_class_in_the_hyperparameters(tmp_path):
    """cli.py reads (and drops) the `_class_path` and `_instantiator` keys LightningCLI writes into hparams."""
    from pytorch_lightning.cli import LightningCLI

    private = "LightningCLI hyper_parameters keys _class_path, _instantiator"
    cli = LightningCLI(pl.LightningModule, subclass_mode_model=True, run=False,
                       args=["--model=tests.test_compat.TinyModule", f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false"])
    hparams = dict(cli.model.hparams)
    require(hparams.get("_class_path") == "tests.test_compat.TinyModule", private, f"no _class_path in {sorted(hparams)}")
    require("_instantiator" in hparams and hparams.get("width") == 2, private, f"keys are {sorted(hparams)}")


# torch.
def test_flight_recorder_dumps_the_live_collectives(tmp_path, monkeypatch):
    import json

    import torch.distributed as dist

    private = "torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)"
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "10")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        dist.all_reduce(torch.ones(1))
        try:
            entries = json.loads(compat.flight_recorder_json()).get("entries") or []
        except Exception as e:  # gone, renamed, or another format
            require(False, private, f"{type(e).__name__}: {e}")
    finally:
        dist.destroy_process_group()
    require(any("all_reduce" in str(e.get("profiling_name")) for e in entries), private,
            f"the dump holds no all_reduce: {[e.get('profiling_name') for e in entries]}")
    require(all("collective_seq_id" in e and "state" in e for e in entries), private,
            "entries lack collective_seq_id or state, which the stall report reads")


def test_process_group_timeout_is_read_back(tmp_path):
    import torch.distributed as dist

    private = "ProcessGroup._get_backend(device).options._timeout"
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1, timeout=timedelta(minutes=7))
    try:
        require(compat.process_group_timeout(dist.group.WORLD) == timedelta(minutes=7), private, "does not give the group's timeout")
    finally:
        dist.destroy_process_group()


def test_tensor_version_counts_in_place_changes():
    private = "Tensor._version"
    weight = torch.zeros(3)
    before = compat.tensor_version(weight)
    require(isinstance(before, int), private, "is not an int")
    weight.add_(1)
    require(compat.tensor_version(weight) > before, private, "an in-place change did not bump it")


def test_set_last_lr_is_what_get_last_lr_returns():
    private = "LRScheduler._last_lr"
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    compat.set_last_lr(scheduler, [0.25])
    require(scheduler.get_last_lr() == [0.25], private, f"get_last_lr() returns {scheduler.get_last_lr()}")


# jsonargparse.
def test_add_subcommand_reaches_the_subcommands_lightning_cli_made(capsys):
    from jsonargparse import ArgumentParser
    from pytorch_lightning.cli import LightningCLI

    private = "jsonargparse ArgumentParser._subcommands_action.add_subcommand(name, parser, help=...)"

    class WithHello(LightningCLI):
        def setup_parser(self, add_subcommands, main_kwargs, subparser_kwargs):
            super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
            hello = ArgumentParser()
            hello.add_argument("--name", default="world")
            compat.add_subcommand(self.parser, "hello", hello, help="says hello")

        def parse_arguments(self, parser, args):
            super().parse_arguments(parser, args)
            raise SystemExit(f"parsed {self.config.subcommand} {self.config.hello.name}")

    with pytest.raises(SystemExit) as stop:
        WithHello(TinyModule, args=["hello", "--name=lean"])
    require(str(stop.value) == "parsed hello lean", private, f"the added subcommand did not parse ({stop.value})")
    with pytest.raises(SystemExit):
        WithHello(TinyModule, args=["--help"])
    out = capsys.readouterr().out
    require("hello" in out and "says hello" in out and "fit" in out, private, "the main --help does not list it beside fit")
    with pytest.raises(ValueError, match="no subcommands"):
        compat.add_subcommand(ArgumentParser(), "x", ArgumentParser(), help="x")


# Replaced by a public API; the replacement's assumption is checked here.
def test_a_fit_without_an_optimizer_is_told_by_parameters_not_by_lightnings_stand_in(tmp_path):
    """callbacks/preemption.py no longer imports `_MockOptimizer`: Lightning's stand-in for
    `configure_optimizers() -> None` must hold none of the module's parameters."""
    from pytorch_lightning.callbacks import Callback

    from leanagent.callbacks.preemption import _has_optimizer

    class NoOptimizer(TinyModule):
        def configure_optimizers(self):
            return None

    seen: list[bool] = []

    class Probe(Callback):
        def on_train_start(self, trainer, pl_module):
            seen.append(_has_optimizer(trainer, pl_module))

    for module in (TinyModule(), NoOptimizer()):
        tiny_trainer(tmp_path, max_steps=1, callbacks=[Probe()]).fit(module)
    require(seen == [True, False], "pytorch_lightning.core.optimizer._MockOptimizer",
            f"an optimizer over the module's parameters / none told apart as {seen}, not [True, False]")


def test_mkldnn_bf16_check_answers_for_this_cpu():
    private = "torch.ops.mkldnn._is_mkldnn_bf16_supported"
    try:
        answer = compat.cpu_has_native_bf16()
    except (AttributeError, RuntimeError) as error:
        require(False, private, f"no longer callable ({error})")
    require(isinstance(answer, bool), private, f"returned {answer!r}, not a bool")
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    if x86 and torch.backends.cpu.get_cpu_capability() in ("DEFAULT", "AVX2"):  # no AVX512: oneDNN has no bf16 kernel
        require(answer is False, private, "says native bf16 on an x86 CPU without AVX512")
