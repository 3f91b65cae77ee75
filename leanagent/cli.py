"""The `leanagent` LightningCLI: one app for retriever training, evaluation, prediction and Fisher computation."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from jsonargparse import Namespace
from pytorch_lightning.cli import LightningCLI

from leanagent.callbacks.progressive import ProgressiveTraining
from leanagent.data.datamodule import RetrievalDataModule
from leanagent.distributed import (
    ONE_YEAR,
    check_gpu_count,
    default_strategy,
    is_ddp_class,
    limit_cpu_threads,
    parse_timeout,
    set_nccl_env,
    uses_cpu,
)
from leanagent.errors import LeanAgentError
from leanagent.models.fisher import FisherInformation  # noqa: F401  (registers the subclass)
from leanagent.models.retriever import PremiseRetriever  # noqa: F401
from leanagent.watchdog import Watchdog

log = logging.getLogger("leanagent")


class LeanAgentCLI(LightningCLI):
    """`model: class_path: ...` picks PremiseRetriever or FisherInformation; the data module is shared."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("model_class", pl.LightningModule)
        kwargs.setdefault("datamodule_class", RetrievalDataModule)
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        # ReProver's links: one setting each, shared by model and data.
        parser.link_arguments("model.init_args.model_name", "data.model_name")
        parser.link_arguments("data.max_seq_len", "model.init_args.max_seq_len")
        # A default (not a hook-time injection) so that --print_config and config.yaml show the real strategy.
        parser.set_defaults({"trainer.strategy": default_strategy(ONE_YEAR)})
        # `progressive.epochs_per_repo` at top level, easy to override; the callback joins trainer.callbacks.
        parser.add_lightning_class_args(ProgressiveTraining, "progressive")
        # `--watchdog.stall_after` and `--watchdog.action` at top level: hang reports (leanagent/watchdog.py).
        parser.add_lightning_class_args(Watchdog, "watchdog")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        configure_distributed(config)


def configure_distributed(config: Namespace) -> None:
    """Runs on every rank (Lightning's DDP re-executes the command): env, strategy, threads, GPU count."""
    trainer = config.trainer
    timeout = ONE_YEAR
    strategy = trainer.strategy
    if strategy is None:
        trainer.strategy = Namespace(default_strategy(ONE_YEAR))
        strategy = trainer.strategy
    if isinstance(strategy, (Namespace, dict)) and is_ddp_class(str(strategy.get("class_path", ""))):
        init_args = strategy.get("init_args") or Namespace()
        if init_args.get("timeout") is None:
            init_args["timeout"] = ONE_YEAR
        timeout = parse_timeout(init_args["timeout"])
        init_args["timeout"] = timeout
        strategy["init_args"] = init_args
    else:
        name = strategy if isinstance(strategy, str) else strategy.get("class_path", strategy)
        log.info("trainer.strategy %r was named explicitly: the one-year DDPStrategy was not injected", name)
    set_nccl_env(timeout)
    log.info(
        "rank %s: TORCH_NCCL_ASYNC_ERROR_HANDLING=%s NCCL_TIMEOUT=%s (ms)",
        os.environ.get("LOCAL_RANK", "0"), os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"], os.environ["NCCL_TIMEOUT"],
    )

    accelerator = str(trainer.accelerator)
    check_gpu_count(accelerator, trainer.devices)
    devices = trainer.devices
    if uses_cpu(accelerator) and isinstance(devices, int) and devices > 1:
        limit_cpu_threads(devices)

    ckpt_path = config.get("ckpt_path")
    if ckpt_path and ckpt_path not in ("last", "best", "hpc") and not Path(ckpt_path).is_file():
        raise LeanAgentError(f"--ckpt_path: checkpoint not found: {ckpt_path}")


def _setup_logging() -> None:
    logger = logging.getLogger("leanagent")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[leanagent] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


LIFELONG_COMMANDS = ("lifelong", "ablation", "curriculum")


def main(args: list[str] | None = None) -> None:
    _setup_logging()
    argv = sys.argv[1:] if args is None else args
    _install_fault_handling()
    try:
        if argv and argv[0] in LIFELONG_COMMANDS:
            from leanagent.lifelong.cli import main as lifelong_main

            lifelong_main(argv[0], argv[1:])
        else:
            LeanAgentCLI(args=args)
    except Exception as e:
        user_error = _user_error(e)
        if user_error is None:
            _exit_if_collective_failed(e)
            raise
        rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))  # RANK: global, set by torchrun
        prefix = "error" if rank == "0" else f"error (rank {rank})"
        print(f"{prefix}: {user_error}", file=sys.stderr)
        sys.exit(2)


def _install_fault_handling() -> None:
    """Lost ranks are named (Lightning's child observer replaced); NCCL's flight recorder on where unset."""
    from leanagent import watchdog

    watchdog.install_fault_handling()
    watchdog.set_flight_recorder_env()


def _exit_if_collective_failed(error: BaseException) -> None:
    """A rank whose collective failed because another rank died: one line, not a gloo traceback."""
    from leanagent import watchdog

    failed = watchdog.collective_error(error)
    if failed is not None:
        sys.exit(watchdog.handle_collective_error(failed))


def _user_error(error: BaseException | None) -> LeanAgentError | None:
    """jsonargparse wraps exceptions raised while instantiating classes; find ours in the chain."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, LeanAgentError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
