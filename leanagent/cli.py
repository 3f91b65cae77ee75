"""The `leanagent` LightningCLI: one app for retriever training, evaluation, prediction and Fisher computation."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import pytorch_lightning as pl
from argparse import ArgumentError

from jsonargparse import Namespace
from pytorch_lightning.cli import LightningCLI
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from pytorch_lightning.utilities.model_helpers import is_overridden

from leanagent.callbacks.preemption import Preempted, PreemptionCheckpoint
from leanagent.callbacks.progressive import ProgressiveTraining, check_epochs_per_repo, first_epoch, plan_max_epochs
from leanagent.callbacks.saved_config import ConfigBesideLogs
from leanagent.checkpoint_files import check_resumable, load_checkpoint
from leanagent.data.datamodule import RetrievalDataModule
from leanagent.distributed import ONE_YEAR, configure_distributed, default_strategy
from leanagent.cli_config import (
    check_evaluated_splits,
    check_fisher_pass,
    check_fit_only_model,
    check_model_nulls,
    check_outputs_writable,
    check_seed,
    check_some_epoch_validated,
    check_trainer_values,
    leave_out_lr_monitor_without_logger,
    model_init_args,
    note_log_dir,
    remove_unused_run_folders,
    resolve_data_seed,
    resolve_special_ckpt_path,
    use_final_last_checkpoint,
)
from leanagent.console import process_rank, setup_logging
from leanagent.cli_errors import check_config_files, summarize_parse_error, user_error
from leanagent.compat import add_subcommand
from leanagent.errors import LeanAgentError, ReportedError, one_line
from leanagent.interrupts import Interrupted, stop_on_signals
from leanagent.precision import CpuBf16, describe_fallback, run_precision
from leanagent.retrieval.metrics import format_rankings
from leanagent.lifelong.commands import COMMANDS
from leanagent.models.fisher import FisherInformation  # noqa: F401  (registers the subclass)
from leanagent.models.encoder_negatives import check_miner, mines_with_encoder
from leanagent.models.retriever import PremiseRetriever  # noqa: F401
from leanagent.faults.watchdog import Watchdog

log = logging.getLogger("leanagent")

RETRIEVER_CLASS_PATH = "leanagent.models.retriever.PremiseRetriever"


class LeanAgentCLI(LightningCLI):
    """`model: class_path: ...` picks PremiseRetriever or FisherInformation; the data module is shared."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._only = requested_command(kwargs.get("args"))
        kwargs.setdefault("model_class", pl.LightningModule)
        kwargs.setdefault("datamodule_class", RetrievalDataModule)
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("save_config_callback", ConfigBesideLogs)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        # Parse errors reach main() as exceptions, which prints them as one line (not usage, then the error).
        quiet = {"exit_on_error": False}
        kwargs.setdefault("parser_kwargs", {**quiet, **{name: quiet for name in self.subcommands()}})
        super().__init__(*args, **kwargs)

    def subcommands(self) -> dict[str, set[str]]:  # type: ignore[override]
        """Lightning's trainer methods; only the one asked for when the command line starts with it.

        Each subcommand's parser introspects the Trainer and both modules, most of a command's start-up
        before any data is read; `main.py fit ...` needs only fit's, and `main.py --help` still lists all.
        """
        every = LightningCLI.subcommands()
        if self._only is None:
            return every
        return {name: skip for name, skip in every.items() if name == self._only}

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]) -> None:
        """Lightning's fit/validate/test/predict, then leanagent's own commands in the same tree."""
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        if add_subcommands:
            for name, command in COMMANDS.items():
                if self._only is None or name == self._only:
                    parser = command.parser(exit_on_error=False)
                    add_subcommand(self.parser, name, parser, help=parser.description)

    def add_arguments_to_parser(self, parser) -> None:
        # ReProver's links: one setting each, shared by model and data.
        parser.link_arguments("model.init_args.model_name", "data.model_name")
        parser.link_arguments("data.max_seq_len", "model.init_args.max_seq_len")
        # A default (not a hook-time injection) so that --print_config and config.yaml show the real strategy.
        parser.set_defaults({"trainer.strategy": default_strategy(ONE_YEAR)})
        # ReProver's configs give `model:` settings with no class_path: they mean the retriever.
        parser.set_defaults({"model": {"class_path": RETRIEVER_CLASS_PATH}})
        # `progressive.epochs_per_repo` at top level, easy to override; the callback joins trainer.callbacks.
        parser.add_lightning_class_args(ProgressiveTraining, "progressive")
        # SIGTERM/SIGINT: stop at the next optimizer step with a resumable last.ckpt (see callbacks/preemption.py).
        parser.add_lightning_class_args(PreemptionCheckpoint, "preemption")
        # `--watchdog.stall_after` and `--watchdog.action` at top level: hang reports (leanagent/faults/).
        parser.add_lightning_class_args(Watchdog, "watchdog")
        parser.add_argument(
            "--test_after_fit", type=bool, default=False,
            help="after fit: test the best checkpoint (its hybrid weight chosen on val) and print dense, BM25 and hybrid",
        )
        parser.add_argument(
            "--cpu_bf16", type=CpuBf16, default="auto",
            help="on a CPU: auto runs a bf16 trainer.precision in float32 where the CPU has no native bf16 "
            "(leanagent/precision.py); always keeps bf16",
        )

    def parse_arguments(self, parser, args) -> None:
        self._raw_args = list(sys.argv[1:] if args is None else args)
        super().parse_arguments(parser, args)
        name = self.config.get("subcommand")
        if name not in COMMANDS:
            config = self.config[name] if name else self.config
            check_seed(config)
            check_fit_only_model(config, name)
            check_fisher_pass(config, name)
            check_model_nulls(config)
            resolve_data_seed(config)
        if name in COMMANDS:  # not a Trainer method: nothing of Lightning's to instantiate
            COMMANDS[name].run(self.config[name])
            raise CommandFinished(name)

    def explicit_model_keys(self, subcommand: str | None) -> set[str]:
        """Model settings the user gave (command line or config files): jsonargparse parses without defaults."""
        # A link needs its source even in a parse without defaults: the data side's is given its resolved value.
        config = self.config[subcommand] if subcommand else self.config
        sources = [f"--{key}={config[key]}" for key in LINK_SOURCES if config.get(key) is not None]
        args = [*self._raw_args, *sources]
        given = self.parser.parse_args(args, defaults=False)
        given = given.get(subcommand) if subcommand else given
        model = given.get("model") if given is not None else None
        if not isinstance(model, Namespace):
            return set()
        init_args = model.get("init_args")
        keys = set(init_args.keys()) if isinstance(init_args, Namespace) else set()
        return keys | {k for k in model.keys() if k not in ("class_path", "init_args", "dict_kwargs") and "." not in k}

    def _parse_ckpt_path(self) -> None:
        """LightningCLI lets a checkpoint's hyperparameters override the command line; here what the user
        gave (command line or config file) wins, the rest comes from the checkpoint, said in one line."""
        self._checkpoint = None
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        config = self.config[subcommand]
        resolve_special_ckpt_path(config, subcommand)
        ckpt_path = config.get("ckpt_path")
        if not ckpt_path:
            return
        self._checkpoint = load_checkpoint(ckpt_path)
        if subcommand == "fit":
            check_resumable(self._checkpoint, ckpt_path)
        adopted = adopt_checkpoint_hparams(config, self._checkpoint, self.explicit_model_keys(subcommand))
        if adopted:
            log.info("from checkpoint %s: %s", ckpt_path, ", ".join(f"{k}={v!r}" for k, v in adopted.items()))
        init_args = model_init_args(config)
        if init_args.get("init_from") is not None and not mines_with_encoder(config.get("data")):
            # The checkpoint's weights replace whatever the model starts from: loading init_from too would cost
            # a read and, for a checkpoint of another shape, fail on a file this run does not use. The encoder's
            # hard negatives are mined with init_from before the restore, so there it stays, as the first run had it.
            log.info("--ckpt_path gives the weights: model.init_from %r is not loaded", init_args.init_from)
            init_args.init_from = None

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        configure_distributed(config)
        precision = config.trainer.precision
        self._run_precision = run_precision(precision, str(config.trainer.accelerator), config.get("cpu_bf16") or "auto")
        message = describe_fallback(precision, self._run_precision)
        if message:
            log.info("rank %s: %s", os.environ.get("LOCAL_RANK", "0"), message)
        use_final_last_checkpoint(config)
        leave_out_lr_monitor_without_logger(config)
        check_trainer_values(config, self.subcommand)
        check_evaluated_splits(config, self.subcommand)
        if self.subcommand in ("fit", "predict"):
            check_outputs_writable(config)
        if self.subcommand == "fit":
            check_miner(config.model.get("class_path") if isinstance(config.model, Namespace) else None, config.get("data"))
            explicit = config.trainer.max_epochs
            progressive = config.get("progressive") or Namespace(epochs_per_repo=1)
            check_epochs_per_repo(progressive.epochs_per_repo)  # before the plan uses it
            config.trainer.max_epochs = plan_max_epochs(
                getattr(self, "_checkpoint", None), explicit, int(progressive.epochs_per_repo), config.trainer.max_steps
            )
            check_some_epoch_validated(config, first_epoch(getattr(self, "_checkpoint", None)), config.trainer.max_epochs)
            if config.trainer.max_epochs == -1:
                log.info("rank %s: this fit trains to max_steps=%d (trainer.max_epochs -1: no epoch limit)",
                         os.environ.get("LOCAL_RANK", "0"), config.trainer.max_steps)
            else:
                log.info(
                    "rank %s: this fit trains to max_epochs=%d (%s)", os.environ.get("LOCAL_RANK", "0"),
                    config.trainer.max_epochs,
                    "trainer.max_epochs as given" if explicit is not None and explicit >= 0 else "progressive training",
                )

    def instantiate_trainer(self, **kwargs: Any) -> pl.Trainer:
        """The Trainer in the precision this machine runs well (leanagent/precision.py); the config, and the
        config.yaml a run saves, keep the configured one, so that the same file still means bf16 on a GPU."""
        run = getattr(self, "_run_precision", None)
        if run is not None:
            kwargs.setdefault("precision", run)
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except (ValueError, TypeError, MisconfigurationException) as e:  # Lightning's checks of the trainer's settings
            raise LeanAgentError(f"trainer: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
        if process_rank() == "0":
            note_log_dir(getattr(trainer.logger, "log_dir", None))  # CSV and TensorBoard loggers' version_N
        return trainer

    def before_fit(self) -> None:
        """Every split this fit will read is read now, in the order train, val, test: a bad file fails before
        hard-negative mining embeds the corpus (minutes on a large project), not after it or after the fit."""
        if not hasattr(self.datamodule, "check_split"):
            return
        self.datamodule.train_states()
        if self.trainer.limit_val_batches != 0 and is_overridden("validation_step", self.model):  # else no val loop
            self.datamodule.check_split("val")
        if self.config.fit.get("test_after_fit"):
            self.datamodule.check_split("test")

    def after_fit(self) -> None:
        """`test_after_fit`: adapting to a project is one command (configs/recipes/project.yaml)."""
        if not self.config.fit.get("test_after_fit"):
            return
        callback = self.trainer.checkpoint_callback
        best = getattr(callback, "best_model_path", "") if callback is not None else ""
        # The fit is done and saved: a signal now stops only the test, which the advice reruns on its own.
        advice = (f"the fit had finished: test its best checkpoint with `main.py test` and --ckpt_path={best}" if best
                  else "the fit had finished: test it with `main.py test`")
        with stop_on_signals("the test after fit", advice):
            logged = self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best or None, verbose=False)
        if self.trainer.is_global_zero and logged:
            chosen = bool(getattr(self.model, "hybrid_weight_chosen", False))
            print(format_rankings(logged[0], "test", best or "the final weights", chosen), flush=True)


ARCHITECTURE_KEYS = ("model_name",)
LINKED_KEYS = ("max_seq_len",)  # set from data.max_seq_len, never from a checkpoint
LINK_SOURCES = ("data.max_seq_len",)


def adopt_checkpoint_hparams(config: Namespace, checkpoint: dict[str, Any], explicit: set[str]) -> dict[str, Any]:
    """Fill the model settings the user did not give from the checkpoint's; refuse another architecture."""
    hparams = dict(checkpoint.get("hyper_parameters") or {})
    class_path = hparams.pop("_class_path", None)
    hparams.pop("_instantiator", None)
    model = config.get("model")
    if not hparams or not isinstance(model, Namespace):
        return {}
    if class_path and model.get("class_path") and class_path != model.class_path:
        raise LeanAgentError(
            f"--ckpt_path holds a {class_path.rsplit('.', 1)[-1]}, but the model is {model.class_path.rsplit('.', 1)[-1]}"
        )
    init_args = model_init_args(config)
    adopted: dict[str, Any] = {}
    for key, saved in hparams.items():
        if key in LINKED_KEYS or key not in init_args:
            continue
        given = init_args[key]
        if key in ARCHITECTURE_KEYS and given != saved and key in explicit:
            raise LeanAgentError(
                f"--ckpt_path was trained with {key} '{saved}', but model.init_args.{key} is '{given}': "
                f"a checkpoint only loads into its own architecture (drop the setting or pass {key}={saved})"
            )
        if key not in explicit and given != saved:
            init_args[key] = saved
            adopted[key] = saved
            if key == "model_name" and config.get("data") is not None:
                config.data.model_name = saved
    return adopted


def requested_command(args: Any) -> str | None:
    """The subcommand a command line starts with (`fit`, `lifelong`, ...), or None: build every parser.

    Only a first word counts: anything before it (a top-level `--config`, `--help`) may choose or list
    any subcommand.
    """
    argv = sys.argv[1:] if args is None else args
    if not isinstance(argv, (list, tuple)) or not argv:
        return None
    first = argv[0]
    return first if first in LightningCLI.subcommands() or first in COMMANDS else None


class CommandFinished(Exception):
    """One of leanagent's own commands ran; there is no Trainer method to run after it."""


def main(args: list[str] | None = None) -> None:
    setup_logging()
    argv = sys.argv[1:] if args is None else args
    _install_fault_handling()
    command = argv[0] if argv and not argv[0].startswith("-") else "the command"
    try:
        check_config_files(argv)
        # Outside a fit's training steps (which the preemption callback stops with a checkpoint), a signal
        # stops the command at once with one line, instead of Lightning's silent exit 0 (leanagent/interrupts.py).
        with stop_on_signals(command):
            LeanAgentCLI(args=args)
    except CommandFinished:
        return
    except (Preempted, Interrupted) as stop:
        # Inside a lifelong stage the runner says what to do (rerun the lifelong command), not --ckpt_path.
        stage = os.environ.get("LEANAGENT_LIFELONG_STAGE") == "1"
        if not stage and os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") in ("", "0"):
            print(f"preempted: {one_line(stop)}" if isinstance(stop, Preempted) else f"error: {one_line(stop)}", file=sys.stderr, flush=True)
        if isinstance(stop, Interrupted):  # a Preempted fit's ranks agreed to stop at the same step already
            from leanagent.faults.rank_observer import pass_on_signal

            pass_on_signal(stop.signum)
        sys.exit(128 + stop.signum)
    except ArgumentError as e:
        print(f"error: {one_line(summarize_parse_error(str(e), argv))}", file=sys.stderr)
        sys.exit(2)
    except Exception as e:
        found = user_error(e)
        if found is None:
            _exit_if_collective_failed(e)
            raise
        rank = process_rank()
        prefix = "error" if rank == "0" else f"error (rank {rank})"
        if rank == "0":
            from leanagent.faults.state import state

            remove_unused_run_folders(state.folder)
        print(one_line(found) if isinstance(found, ReportedError) else f"{prefix}: {one_line(found)}", file=sys.stderr)
        sys.exit(getattr(found, "exit_code", 2))


def _install_fault_handling() -> None:
    """Lost ranks are named (Lightning's child observer replaced); no collective inside Lightning's SIGTERM
    handler (compat.sigterm_handler_without_collectives); NCCL's flight recorder on where unset."""
    from leanagent.compat import sigterm_handler_without_collectives
    from leanagent.faults.flight_recorder import set_flight_recorder_env
    from leanagent.faults.rank_observer import install_fault_handling

    install_fault_handling()
    sigterm_handler_without_collectives()
    set_flight_recorder_env()


def _exit_if_collective_failed(error: BaseException) -> None:
    """A rank whose collective failed because another rank died: one line, not a gloo traceback."""
    from leanagent.faults.collectives import collective_error, handle_collective_error

    failed = collective_error(error)
    if failed is not None:
        sys.exit(handle_collective_error(failed))
