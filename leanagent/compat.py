"""Every private name of Lightning, lightning_fabric, torch and jsonargparse that leanagent relies on, in one place.

Each function says what private thing it wraps and why no public API does the job. An upgrade that
removes or changes one of them fails `tests/test_compat.py` with a message naming it, instead of a
hang or a silent change of behaviour in a long run. docs/private_apis.md lists them with their users.
"""

from __future__ import annotations

import subprocess
from datetime import timedelta
from typing import Any, Callable

import pytorch_lightning as pl
import torch

# Lightning and lightning_fabric.


def replace_child_process_observer(start: Callable[[list[subprocess.Popen]], None]) -> None:
    """Make Lightning's launcher call `start(child_processes)` instead of starting its own observer.

    Wraps `pytorch_lightning.strategies.launchers.subprocess_script._launch_process_observer`, which
    `_SubprocessScriptLauncher.launch` calls right after spawning ranks 1..N-1. Lightning's observer
    kills every rank (SIGKILL) the moment one child exits non-zero, without naming it, so the
    survivors never say why they stop; no Trainer or strategy argument turns it off or replaces it.
    Idempotent.
    """
    from pytorch_lightning.strategies.launchers import subprocess_script

    current = subprocess_script._launch_process_observer
    if getattr(current, "_leanagent_start", None) is start:
        return

    def _launch_process_observer(child_processes: list[subprocess.Popen]) -> None:
        start(child_processes)

    _launch_process_observer._leanagent_start = start  # type: ignore[attr-defined]
    subprocess_script._launch_process_observer = _launch_process_observer


def cluster_environment(trainer: pl.Trainer) -> Any:
    """The cluster environment Lightning's signal handling decides on (SLURM auto-requeue or not).

    Wraps `trainer._accelerator_connector.cluster_environment`. `trainer.strategy.cluster_environment`
    is public but exists only on parallel strategies; Lightning's `_SignalConnector` reads this
    attribute for every strategy (a single-GPU SLURM job too), and the preemption callback must take
    the same decision as Lightning about who handles SIGTERM.
    """
    return trainer._accelerator_connector.cluster_environment


def save_last_checkpoint(callback: Any, trainer: pl.Trainer) -> None:
    """Write the checkpoint callback's `last` checkpoint now, as Lightning's ModelCheckpoint would.

    Wraps `ModelCheckpoint._save_last_checkpoint(trainer, ModelCheckpoint._monitor_candidates(trainer))`.
    That method alone knows the `last` file's name (its template, version counter and `save_last="link"`),
    sets `last_model_path` before writing (it is part of the saved state) and removes the previous one;
    ModelCheckpoint has no public "save last now", and `trainer.save_checkpoint` does none of that.
    """
    callback._save_last_checkpoint(trainer, callback._monitor_candidates(trainer))


def record_checkpoint_saved(callback: Any, filepath: str) -> None:
    """Tell Lightning's ModelCheckpoint that `filepath` is the file it just wrote.

    Wraps `ModelCheckpoint._last_checkpoint_saved`. leanagent's ModelCheckpoint overrides the private
    `_save_checkpoint` hook (the one place every best and last file is written) to write a temporary
    name and rename it; Lightning's version records the temporary name, which `save_last="link"` and
    `on_train_end` then read. No public attribute holds it.
    """
    callback._last_checkpoint_saved = filepath


def sigterm_handler_without_collectives() -> None:
    """Lightning's SIGTERM handler, minus the collective it runs inside the handler.

    Replaces `pytorch_lightning.trainer.connectors.signal_connector._SignalConnector._sigterm_notifier_fn`,
    which `register_signal_handlers` installs for every validate, test and predict (and a fit's sanity check).
    After logging and forwarding the signal to the ranks the launcher spawned, it runs
    `dist.broadcast(src=0)` inside the handler. A handler runs between bytecodes: a rank waiting inside a
    collective runs it only once that collective returns. When SIGTERM reaches every rank while rank 0 waits
    in one, the other ranks wait in the broadcast and rank 0 in its collective, for good. The broadcast
    carries nothing (no rank reads the tensor), so this keeps the log line, the forwarding and the flag.
    No Trainer argument turns the handler off. Idempotent.
    """
    import logging

    from pytorch_lightning.trainer.connectors.signal_connector import _SignalConnector

    if hasattr(_SignalConnector._sigterm_notifier_fn, "_lightnings"):  # already ours
        return
    log = logging.getLogger("leanagent")

    def _sigterm_notifier_fn(self: Any, signum: int, _: Any) -> None:
        log.info("rank %d: received signal %d", self.trainer.global_rank, signum)
        if not self.received_sigterm and self.trainer.strategy.launcher is not None:
            self.trainer.strategy.launcher.kill(signum)
        self.received_sigterm = True

    _sigterm_notifier_fn._lightnings = _SignalConnector._sigterm_notifier_fn  # type: ignore[attr-defined]
    _SignalConnector._sigterm_notifier_fn = _sigterm_notifier_fn


# torch.


def flight_recorder_json() -> bytes:
    """This process's flight recorder (its last collectives, all backends) as JSON bytes.

    Wraps `torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False)`.
    torch's public side of the flight recorder is NCCL's dump-on-timeout to files and the offline
    `torch.distributed.flight_recorder` analyser; neither dumps a live gloo or NCCL recorder on demand.
    """
    from torch._C._distributed_c10d import _dump_fr_trace_json

    return _dump_fr_trace_json(includeCollectives=True, onlyActive=False)


def process_group_timeout(group: Any) -> timedelta | None:
    """The timeout `group` was created with, read back from its CUDA or CPU backend; None if neither says.

    Wraps `ProcessGroup._get_backend(device).options._timeout`. torch.distributed has no public getter
    for a live group's timeout; the barriers log it so that a 364-day timeout is visible on every rank.
    """
    for device in ("cuda", "cpu"):
        try:
            return group._get_backend(torch.device(device)).options._timeout
        except (RuntimeError, AttributeError):
            continue
    return None


def tensor_version(tensor: torch.Tensor) -> int:
    """The counter every in-place change of `tensor` bumps (optimizer step, `load_state_dict`, `copy_`).

    Wraps `Tensor._version` (autograd's version counter). No public attribute says that a tensor was
    changed in place; hashing the weights instead would cost a pass over all of them per evaluation.
    """
    return tensor._version


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 matmuls natively (x86 AVX512 with oneDNN, AMX; Arm with BF16).

    Wraps `torch.ops.mkldnn._is_mkldnn_bf16_supported()`, the check torch's own CPU tests use. torch has no
    public query: `torch.backends.cpu.get_cpu_capability()` names the vector ISA ("AVX2") but not whether
    bf16 has a fast kernel, and without one every bf16 matmul runs a reference loop tens of times slower
    than float32.
    """
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def set_last_lr(scheduler: torch.optim.lr_scheduler.LRScheduler, lrs: list[float]) -> None:
    """Make `scheduler.get_last_lr()` return `lrs` after the learning rates were set by hand.

    Wraps `LRScheduler._last_lr`, which only `step()` writes; a resumed fit that moves the schedule to
    this run's learning rate must not report the checkpoint's until the next step.
    """
    scheduler._last_lr = list(lrs)


def _zero(progress: dict[str, Any], *parts: str) -> None:
    """Lightning's `reset_on_run` on a saved progress tracker (nested for an optimizer's): the named counters 0."""
    for key, value in progress.items():
        if key in parts and isinstance(value, dict):
            value.update(dict.fromkeys(value, 0))
        elif isinstance(value, dict):
            _zero(value, *parts)
    if "is_last_batch" in progress:
        progress["is_last_batch"] = False


def close_saved_epoch(checkpoint: dict[str, Any]) -> int | None:
    """Make a checkpoint saved at an epoch's end (in `on_train_epoch_end`, after its validation) one saved at
    the next epoch's start. Returns its count of stepped batches (the step loggers use), which the restored
    fit must hold at its first batch (`set_batches_that_stepped`); None for any other checkpoint.

    Lightning counts that epoch as processed, not completed. Resumed by epochs it completes it itself and
    starts the next one afresh (`_FitLoop.on_run_start`, `reset_on_run`). With `trainer.max_steps` set it
    restarts on the epoch's end instead and runs the epoch-end hooks again, where EarlyStopping finds no
    validation metric (the validation ran before the checkpoint was saved) and stops the fit with a
    traceback. Done here, in the saved loop state, both resume alike, except for the loggers' step, which
    Lightning moves once more when it restarts a validated epoch by steps (`hold_batches_that_stepped`).
    Wraps the layout of Lightning's saved loop state (`loops["fit_loop"]`: progress trackers and
    `epoch_loop.state_dict["_batches_that_stepped"]`).
    """
    fit = (checkpoint.get("loops") or {}).get("fit_loop")
    try:
        total, current = fit["epoch_progress"]["total"], fit["epoch_progress"]["current"]
        at_end = all(p["ready"] == p["started"] == p["processed"] == p["completed"] + 1 for p in (total, current))
        at_end = at_end and fit["epoch_loop.batch_progress"]["is_last_batch"] is True
        stepped = fit["epoch_loop.state_dict"]["_batches_that_stepped"]
    except (KeyError, TypeError):
        return None
    if not at_end or not isinstance(stepped, int):
        return None
    total["completed"], current["completed"] = total["processed"], current["processed"]
    for key in ("epoch_loop.batch_progress", "epoch_loop.scheduler_progress", "epoch_loop.automatic_optimization.optim_progress"):
        if isinstance(fit.get(key), dict):
            _zero(fit[key], "current")
    if isinstance(fit.get("epoch_loop.val_loop.batch_progress"), dict):
        _zero(fit["epoch_loop.val_loop.batch_progress"], "current", "total")
    return stepped


def hold_batches_that_stepped(trainer: pl.Trainer, count: int) -> None:
    """At the start of the epoch a fit resumed from a checkpoint that `close_saved_epoch` changed: make the first
    trained batch log at `count`, the checkpoint's step. Restarting a validated epoch by steps, Lightning first
    passes through a batch it does not train (it takes it for the saved epoch's last, already validated) and
    counts it as stepped; start one lower then. Wraps `_TrainingEpochLoop._batches_that_stepped`, its
    `restarted_on_last` and `_should_check_val_epoch`."""
    loop = trainer.fit_loop.epoch_loop
    skipped = loop.restarting and loop.restarted_on_last and loop._should_check_val_epoch()
    loop._batches_that_stepped = count - 1 if skipped else count


def batches_that_stepped(trainer: pl.Trainer) -> int:
    """The step the loggers write now (`_TrainingEpochLoop._batches_that_stepped`; `global_step` counts optimizer steps)."""
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


def set_batches_that_stepped(trainer: pl.Trainer, count: int) -> None:
    """Correct the loggers' step where Lightning moved it (see `hold_batches_that_stepped`)."""
    trainer.fit_loop.epoch_loop._batches_that_stepped = count


# jsonargparse.


def add_subcommand(parser: Any, name: str, subparser: Any, help: str) -> None:
    """Add `name` (parsed by `subparser`) to the subcommands `parser` already has (LightningCLI's fit, validate, ...).

    Wraps `parser._subcommands_action.add_subcommand(name, subparser, help=help)`. jsonargparse's
    public `add_subcommands()` may be called once per parser and returns the action, but LightningCLI
    creates it inside `_add_subcommands` and keeps no reference; the parser's private attribute is the
    only way to reach it.
    """
    action = getattr(parser, "_subcommands_action", None)
    if action is None:
        raise ValueError(f"{parser.prog!r} has no subcommands to add {name!r} to")
    action.add_subcommand(name, subparser, help=help)
