"""Checks and fix-ups of a parsed command's config, made before anything is instantiated or written: a bad
value is one `error:` line now, not a traceback from Lightning or a failure after an epoch of training."""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import re
import typing
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

from leanagent.callbacks.checkpoints import default_dirpath
from leanagent.checkpoint_files import SPECIAL_CKPT_PATHS
from leanagent.data.samplers import DEFAULT_SEED
from leanagent.errors import LeanAgentError
from leanagent.io import ensure_writable, missing_folders, remove_empty_folders, write_target

log = logging.getLogger("leanagent")

LIGHTNING_MODEL_CHECKPOINT = (
    "pytorch_lightning.callbacks.ModelCheckpoint",
    "pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint",
)
FINAL_LAST_CHECKPOINT = "leanagent.callbacks.checkpoints.ModelCheckpoint"
SEED_RANGE = (0, 2**32 - 1)  # what numpy, and so seed_everything, accepts


def use_final_last_checkpoint(config: Namespace) -> None:
    """LeanAgent's configs name Lightning's ModelCheckpoint, whose last.ckpt can lag behind the final epoch;
    ours takes the same arguments and always writes the final state."""
    callbacks = config.trainer.get("callbacks") or []
    for callback in callbacks if isinstance(callbacks, list) else []:
        if isinstance(callback, Namespace) and callback.get("class_path") in LIGHTNING_MODEL_CHECKPOINT:
            callback.class_path = FINAL_LAST_CHECKPOINT
            log.info("trainer.callbacks: %s runs as %s (same arguments; last.ckpt is always the final epoch)",
                     LIGHTNING_MODEL_CHECKPOINT[0], FINAL_LAST_CHECKPOINT)


def has_no_logger(config: Namespace) -> bool:
    """`trainer.logger` false (or an empty list): Lightning then has no log folder, only the working one."""
    logger = config.trainer.get("logger")
    return logger is False or logger == []


def leave_out_lr_monitor_without_logger(config: Namespace) -> None:
    """`--trainer.logger=false` with the configs' LearningRateMonitor is Lightning's traceback at the start of
    training: with no logger there is no lr to record, so the monitor is left out, said in one line."""
    callbacks = config.trainer.get("callbacks")
    if not has_no_logger(config) or not isinstance(callbacks, list):
        return
    kept = [c for c in callbacks if not (isinstance(c, Namespace) and str(c.get("class_path")).endswith(".LearningRateMonitor"))]
    if len(kept) < len(callbacks):
        config.trainer.callbacks = kept
        log.info("trainer.logger is false: LearningRateMonitor, which records the lr in the logger, is left out")


def logger_name(config: Namespace) -> str | None:
    logger = config.trainer.get("logger")
    if isinstance(logger, Namespace):
        return (logger.get("init_args") or Namespace()).get("name")
    return None


def check_trainer_values(config: Namespace, subcommand: str | None) -> None:
    """Values Lightning refuses with a traceback (or, for accumulate_grad_batches 0, a ZeroDivisionError mid-fit),
    and a fit that would train nothing yet write checkpoints as if it had."""
    for key in ("accumulate_grad_batches", "num_nodes", "check_val_every_n_epoch"):  # each may be null
        value = config.trainer.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise LeanAgentError(f"trainer.{key} must be a positive integer, got {value!r}")
    nodes = config.trainer.get("num_nodes")
    if isinstance(nodes, int) and nodes > 1 and not _started_for_nodes():
        raise LeanAgentError(
            f"trainer.num_nodes={nodes}, but nothing starts the other nodes' processes (no torchrun, no SLURM step of "
            "several tasks, no NODE_RANK or MASTER_ADDR): this process would wait for them until the process group "
            "times out; launch one process per node with torchrun or srun (README, Distributed), or leave num_nodes at 1")
    name = logger_name(config)  # lightning_logs/<name>/ and checkpoints/<name>/: a path would write outside both
    if isinstance(name, str) and (os.path.isabs(name) or ".." in Path(name).parts):
        raise LeanAgentError(f"trainer.logger.init_args.name: {name!r} names the run's folders under lightning_logs/ and "
                             "checkpoints/: give it without a leading '/' or '..' (trainer.default_root_dir moves both)")
    interval = config.trainer.get("val_check_interval")
    if interval is not None and not isinstance(interval, bool) and isinstance(interval, (int, float)) and interval <= 0:
        raise LeanAgentError(f"trainer.val_check_interval must be a positive number of batches or fraction of an "
                             f"epoch, got {interval!r}")
    clip = config.trainer.get("gradient_clip_val")  # Lightning skips clipping for any value <= 0, silently
    if clip is not None and not isinstance(clip, bool) and isinstance(clip, (int, float)) and not clip >= 0:
        raise LeanAgentError(f"trainer.gradient_clip_val must be a non-negative number (0 or null: no clipping), got {clip!r}")
    if subcommand == "fit" and config.trainer.get("limit_train_batches") in (0, 0.0):
        raise LeanAgentError("trainer.limit_train_batches is 0: this fit would train nothing (leave it unset, or give a "
                             "positive number of batches or fraction of them)")
    if subcommand == "fit" and config.trainer.get("max_steps") == 0:
        raise LeanAgentError("trainer.max_steps is 0: this fit would train nothing (leave it at -1, no limit, or give a "
                             "positive number of optimizer steps)")
    evaluated = {"validate": "limit_val_batches", "test": "limit_test_batches", "predict": "limit_predict_batches"}
    if subcommand in evaluated and config.trainer.get(evaluated[subcommand]) in (0, 0.0):
        raise LeanAgentError(f"trainer.{evaluated[subcommand]} is 0: {subcommand} would read no batch and report nothing "
                             "(leave it unset, or give a positive number of batches or fraction of them)")
    monitors = validation_monitors(config)
    if subcommand == "fit" and monitors and config.trainer.get("limit_val_batches") in (0, 0.0):
        raise LeanAgentError(
            f"trainer.limit_val_batches is 0, so no epoch is validated, but {', '.join(monitors)} "
            "(the best checkpoint and early stopping need it): leave it unset or positive, or give a config whose "
            "trainer.callbacks list leaves those out")
    if subcommand == "fit" and config.get("test_after_fit") and config.trainer.get("limit_test_batches") in (0, 0.0):
        raise LeanAgentError("trainer.limit_test_batches is 0, but test_after_fit tests the fit: the test would read "
                             "no batch (leave it unset, or set test_after_fit=false)")


def check_some_epoch_validated(config: Namespace, start: int, max_epochs: int) -> None:
    """A fit whose epochs all fall between validations: Lightning validates epoch e (from 0) only when e + 1 is a
    multiple of check_val_every_n_epoch, and a monitoring callback then never sees its metric, without a word."""
    every = config.trainer.get("check_val_every_n_epoch")
    monitors = validation_monitors(config)
    if not monitors or not isinstance(every, int) or every < 1 or max_epochs < 0 or max_epochs // every > start // every:
        return
    epochs = f"epoch {start}" if max_epochs - start == 1 else f"epochs {start} to {max_epochs - 1}"
    raise LeanAgentError(
        f"trainer.check_val_every_n_epoch is {every}, so this fit, which trains {epochs} (from 0), validates none of "
        f"them, but {', '.join(monitors)} (the best checkpoint and early stopping need it): give a value of at most "
        f"{max_epochs - start}, or train more epochs")


def validation_monitors(config: Namespace) -> list[str]:
    """'Callback monitors metric' for each configured callback that monitors a validation metric."""
    found = []
    for callback in config.trainer.get("callbacks") or []:
        init_args = callback.get("init_args") if isinstance(callback, Namespace) else None
        monitor = init_args.get("monitor") if isinstance(init_args, Namespace) else None
        if isinstance(monitor, str) and re.search(r"_val(/|$)", monitor):  # Recall@10_val, Recall@10_val/hybrid
            found.append(f"{str(callback.get('class_path')).rsplit('.', 1)[-1]} monitors {monitor}")
    return found


def _started_for_nodes() -> bool:
    """A launcher (or a user, by hand) told this process where it sits among several nodes."""
    from leanagent.faults.heartbeats import external_launcher

    return external_launcher() or any(os.environ.get(name) for name in ("NODE_RANK", "MASTER_ADDR", "GROUP_RANK"))


def check_fit_only_model(config: Namespace, subcommand: str | None) -> None:
    """The Fisher module has only a fit (one pass that writes the Fisher file): validate, test and predict would
    fail inside Lightning with "requires forward method" or "no test_step"."""
    model = config.get("model")
    class_path = model.get("class_path") if isinstance(model, Namespace) else None
    if subcommand in ("validate", "test", "predict") and isinstance(class_path, str) and class_path.endswith(".FisherInformation"):
        raise LeanAgentError(f"{subcommand}: {class_path} only computes the Fisher information, with `fit`; "
                             f"{subcommand} a retriever with --config configs/retrieval.yaml")


def check_fisher_pass(config: Namespace, subcommand: str | None) -> None:
    """The empirical Fisher is a mean over the whole training split: a pass cut short was refused only after
    it had run, when the counts did not add up."""
    model = config.get("model")
    class_path = model.get("class_path") if isinstance(model, Namespace) else None
    init_args = model.get("init_args") if isinstance(model, Namespace) else None
    mode = init_args.get("mode", "empirical") if isinstance(init_args, Namespace) else "empirical"
    if subcommand == "fit" and str(class_path).endswith(".FisherInformation") and mode == "empirical":
        for key, whole in (("limit_train_batches", 1.0), ("max_steps", -1)):
            value = config.trainer.get(key)  # an int limit is batches: 1 is one batch, 1.0 all of them
            if value is not None and not (value == whole and type(value) is type(whole)):
                raise LeanAgentError(f"trainer.{key}={value}: the empirical Fisher is a mean over the whole training "
                                     f"split, so its pass reads every batch: leave trainer.{key} unset")


def check_seed(config: Namespace) -> None:
    seed = config.get("seed_everything")
    if isinstance(seed, int) and not isinstance(seed, bool) and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise LeanAgentError(f"seed_everything must be true, false or an integer in [0, 2**32 - 1], got {seed}")


def resolve_data_seed(config: Namespace) -> None:
    """data.seed left null follows seed_everything where that is a number, so that another run seed draws other
    negatives and another order (the shipped encoders have no dropout: the data is all a seed changes). `true`
    would draw a seed in each process, which ranks started by torchrun would not share, so it keeps DEFAULT_SEED."""
    data = config.get("data")
    if isinstance(data, Namespace) and "seed" in data and data.get("seed") is None:
        seed = config.get("seed_everything")
        data.seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else DEFAULT_SEED


def _accepts_none(hint: Any) -> bool:
    args = typing.get_args(hint)
    return hint in (Any, object, None, type(None)) or type(None) in args or None in args  # None in a Literal


def check_model_nulls(config: Namespace) -> None:
    """`null` for a model or data setting that takes no null (`--model.init_args.lr=null`, `batch_size: null` in a
    config file): jsonargparse lets it through to the class, which then fails with a TypeError inside
    jsonargparse's instantiation or later; one line instead. A setting whose default is None takes it, whatever
    its annotation says."""
    model = config.get("model")
    class_path = model.get("class_path") if isinstance(model, Namespace) else None
    init_args = model.get("init_args") if isinstance(model, Namespace) else None
    if isinstance(class_path, str) and isinstance(init_args, Namespace):
        module, _, name = class_path.rpartition(".")
        try:
            _check_nulls(getattr(importlib.import_module(module), name), init_args, "model")
        except (ImportError, AttributeError, ValueError):  # a class jsonargparse itself will refuse, naming it
            pass
    data = config.get("data")
    if isinstance(data, Namespace) and "class_path" not in data:  # the CLI's own datamodule, its settings in place
        from leanagent.data.datamodule import RetrievalDataModule

        _check_nulls(RetrievalDataModule, data, "data")


def _check_nulls(cls: type, values: Namespace, prefix: str) -> None:
    try:
        hints, parameters = typing.get_type_hints(cls.__init__), inspect.signature(cls.__init__).parameters
    except Exception:  # an annotation that does not resolve: jsonargparse has its own say
        return
    for key, value in vars(values).items():
        if value is not None or key not in hints or _accepts_none(hints[key]):
            continue
        if key in parameters and parameters[key].default is None:
            continue
        hint = hints[key]
        kind = hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
        article = "an" if kind[:1] in "aeiou" else "a"
        raise LeanAgentError(f"{prefix}.{key} is null, but it must be {article} {kind}: give a value or leave the setting out")


def model_init_args(config: Namespace) -> Namespace:
    """The model's init_args, as a Namespace that assignments reach (an empty, detached one when there are none)."""
    model = config.get("model")
    init_args = model.get("init_args") if isinstance(model, Namespace) else None
    return init_args if isinstance(init_args, Namespace) else Namespace()


def checkpoint_dirpath(config: Namespace) -> str:
    """Where this config's ModelCheckpoint writes (its dirpath, or checkpoints/<logger name>)."""
    for callback in config.trainer.get("callbacks") or []:
        if isinstance(callback, Namespace) and callback.get("class_path") in (FINAL_LAST_CHECKPOINT, *LIGHTNING_MODEL_CHECKPOINT):
            dirpath = (callback.get("init_args") or Namespace()).get("dirpath")
            if dirpath:
                return str(dirpath)
    return default_dirpath(logger_name(config) or "lightning_logs", config.trainer.get("default_root_dir"))


def resolve_special_ckpt_path(config: Namespace, subcommand: str) -> None:
    """Lightning's named checkpoints in a command of their own: `last` is this config's last.ckpt (a fit without
    one starts fresh, as Lightning's does); `best`, `hpc` and `registry` name nothing a new process can find."""
    name = config.get("ckpt_path")
    if name not in SPECIAL_CKPT_PATHS:
        return
    folder = checkpoint_dirpath(config)
    last = Path(folder) / "last.ckpt"
    if name == "last" and last.is_file():
        config.ckpt_path = str(last)
        log.info("--ckpt_path=last: %s", last)
    elif name == "last" and subcommand == "fit":
        config.ckpt_path = None
        log.info("--ckpt_path=last: no %s yet, so this fit starts fresh", last)
    elif name == "last":
        raise LeanAgentError(f"--ckpt_path=last: no checkpoint {last} to {subcommand}; give a checkpoint file")
    else:
        raise LeanAgentError(
            f"--ckpt_path={name}: a new process has no {name!r} checkpoint to find; give a checkpoint file "
            f"(such as {last}, or the best epoch's file in {folder})"
        )


def check_outputs_writable(config: Namespace) -> None:
    """Find an unwritable output folder now, not after an epoch of training (or a whole prediction pass)."""
    folders: list[tuple[str, str]] = []
    for i, callback in enumerate(config.trainer.get("callbacks") or []):
        if not isinstance(callback, Namespace):
            continue
        dirpath = (callback.get("init_args") or Namespace()).get("dirpath")
        if not dirpath and callback.class_path == FINAL_LAST_CHECKPOINT:
            dirpath = default_dirpath(logger_name(config) or "lightning_logs", config.trainer.get("default_root_dir"))
        if dirpath:
            folders.append((f"trainer.callbacks[{i}] ({callback.class_path.rsplit('.', 1)[-1]}) dirpath", dirpath))
    logger = config.trainer.get("logger")
    if isinstance(logger, Namespace) and logger.get("init_args", Namespace()).get("save_dir"):
        folders.append(("trainer.logger save_dir", logger.init_args.save_dir))
    model_args = model_init_args(config)
    if "output_path" in model_args and model_args.output_path == "":
        raise LeanAgentError("model.output_path is empty: give a file path")
    files = _file_outputs(config, model_args)
    for what, path in files:
        _check_file_output(what, path)
    for what, folder in [*folders, *((what, str(write_target(Path(path)).parent)) for what, path in files)]:
        ensure_writable(folder, what)  # a link's target folder is what gets written
    for what, path in files:
        for read_what, read in _inputs(config, model_args):
            if _same_file(path, read):
                raise LeanAgentError(f"{what}: {path} is also {read_what}, which this run reads; writing it would "
                                     "replace that input: give another file path")


def check_evaluated_splits(config: Namespace, subcommand: str | None) -> None:
    """The split files validate, test or predict reads, checked before the ranks start: found missing by each
    rank's data hook, the same error came once per rank."""
    data = config.get("data")
    if subcommand not in ("validate", "test", "predict") or not isinstance(data, Namespace) or not data.get("data_path"):
        return
    splits = {"validate": ["val"], "test": ["test"]}.get(subcommand) or list(data.get("predict_splits") or [])
    missing = [f"{split}.json" for split in splits if not (Path(data.data_path) / f"{split}.json").is_file()]
    if missing and Path(data.data_path).is_dir():
        hint = ("; name the splits it has with --data.predict_splits=[...]" if subcommand == "predict"
                else f": {subcommand} evaluates that split")
        raise LeanAgentError(f"{'data.predict_splits' if subcommand == 'predict' else subcommand}: {data.data_path} "
                             f"has no {', '.join(missing)}{hint}")


def _check_file_output(what: str, path: str) -> None:
    if Path(path).is_dir() or path.endswith(("/", os.sep)):
        raise LeanAgentError(f"{what}: {path} is a folder; give a file path")
    if Path(path).exists() and not Path(path).is_file():  # a device (/dev/null) or a pipe: the rename would replace it
        raise LeanAgentError(f"{what}: {path} is not a regular file (a device or a pipe); give a file path")


def _file_outputs(config: Namespace, model_args: Namespace) -> list[tuple[str, str]]:
    """The files a run writes where the user names them: callbacks' and the model's output_path."""
    found = [(f"trainer.callbacks[{i}] ({c.class_path.rsplit('.', 1)[-1]}) output_path", str(c.init_args.output_path))
             for i, c in enumerate(config.trainer.get("callbacks") or [])
             if isinstance(c, Namespace) and (c.get("init_args") or Namespace()).get("output_path")]
    return found + ([("model.init_args.output_path", str(model_args.output_path))] if model_args.get("output_path") else [])


def _inputs(config: Namespace, model_args: Namespace) -> list[tuple[str, str]]:
    """Files this run reads that a user could also name as an output."""
    data = config.get("data") if isinstance(config.get("data"), Namespace) else Namespace()
    named = [("data.corpus_path", data.get("corpus_path")), ("--ckpt_path", config.get("ckpt_path"))]
    named += [(f"model.{key}", model_args.get(key)) for key in ("ckpt_path", "init_from", "fisher_path")]
    if data.get("data_path"):
        named += [(f"the {split} split", str(Path(data.data_path) / f"{split}.json")) for split in ("train", "val", "test")]
    return [(what, str(path)) for what, path in named if isinstance(path, (str, os.PathLike)) and path]


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # either does not exist (yet): the same path is the same file
        return os.path.realpath(a) == os.path.realpath(b)


# Log folders this process's trainer would create (a new version_N), for `remove_unused_run_folders`.
_NEW_LOG_DIRS: list[Path] = []
_NEW_PARENTS: list[Path] = []
_SETUP_FILES = {"config.yaml", "hparams.yaml"}  # what Lightning writes before any step or metric


def note_log_dir(log_dir: str | None) -> None:
    """Remember the trainer's log folder if it does not exist yet: a user error found later removes it again."""
    if log_dir and not Path(log_dir).exists():
        _NEW_LOG_DIRS.append(Path(log_dir))
        _NEW_PARENTS.extend(missing_folders(Path(log_dir).absolute().parent))  # lightning_logs/ too


def remove_unused_run_folders(heartbeat_folder: Path | None) -> None:
    """After a user error, the run folders this command created that hold only what setup wrote (the config,
    the hyperparameters, its heartbeats): bad input writes nothing. A folder with metrics or anything else stays."""
    import shutil

    removed = False
    while _NEW_LOG_DIRS:
        folder = _NEW_LOG_DIRS.pop()
        if folder.is_dir() and {p.name for p in folder.iterdir()} <= _SETUP_FILES:
            shutil.rmtree(folder, ignore_errors=True)
            removed = True
    if removed and heartbeat_folder is not None and heartbeat_folder.is_dir():
        if all(p.name.startswith("rank") and p.suffix == ".json" for p in heartbeat_folder.iterdir()):
            shutil.rmtree(heartbeat_folder, ignore_errors=True)
            remove_empty_folders([heartbeat_folder.parent, heartbeat_folder.parent.parent])  # heartbeats/, the logger's
    remove_empty_folders(_NEW_PARENTS)  # this command made them; one that something else went into stays
    _NEW_PARENTS.clear()
