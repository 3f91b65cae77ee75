"""Lightning checkpoints as inputs: loaded safely, and read for the state of the fit that wrote them.

A fit's plan (first epoch, first optimizer step, epoch budget) and whether it ended are stored in
every checkpoint it writes, so that a resumed fit either finishes the interrupted plan or starts
the next one (progressive training), and the learning-rate schedule spans exactly one fit.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from leanagent.errors import LeanAgentError
from leanagent.io import missing_error

FIT_STATE_KEY = "leanagent_fit"
SPECIAL_CKPT_PATHS = ("last", "best", "hpc", "registry")


def load_checkpoint(path: str | os.PathLike, what: str = "--ckpt_path") -> dict[str, Any]:
    """torch.load with weights_only=True: a pickle payload is refused, never run; damage is one clear error."""
    p = Path(path)
    if p.is_dir():
        raise LeanAgentError(f"{what}: {p} is a folder, not a checkpoint file")
    if not p.is_file():
        raise missing_error(p, f"{what}: ", f"{what}: checkpoint not found: {p}")
    try:
        with open(p, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise LeanAgentError(f"{what}: {p}: cannot read ({e.strerror or type(e).__name__})") from None
    if not head.startswith((b"PK", b"\x80")):  # torch writes a zip archive; its legacy format is a pickle
        raise LeanAgentError(f"{what}: {p} is not a loadable weights-only checkpoint (not a torch file: it starts "
                             f"with {head[:8]!r})")
    try:
        try:
            checkpoint = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise
            checkpoint = torch.load(p, map_location="cpu", weights_only=True)
    # A readable file that torch cannot load is damaged: a truncated zip (an OSError, "Invalid argument",
    # from the memory map), random bytes, an unsafe pickle; torch raises many types.
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if len(first) > 200:  # whole sentences, else whole words
            head = first[:200]
            first = head.rsplit(". ", 1)[0] + ". ..." if ". " in head else head.rsplit(" ", 1)[0] + " ..."
        if "central directory" in first:  # torch's zip reader on a file cut short (or its end overwritten)
            first = "truncated or damaged: its zip archive has no central directory"
        if type(e).__name__ == "UnpicklingError":  # torch's text advises weights_only=False, which we never do
            first = "not a torch checkpoint, or it holds objects other than tensors and plain data"
        raise LeanAgentError(
            f"{what}: {p} is not a loadable weights-only checkpoint ({type(e).__name__}: {first})"
        ) from None
    damaged = _damaged_entry(p)
    if damaged is not None:
        raise LeanAgentError(f"{what}: {p} is not a loadable weights-only checkpoint (damaged: {damaged}; "
                             "a partial copy or a disk error)")
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise LeanAgentError(f"{what}: {p} is not a Lightning checkpoint (no state_dict)")
    for name, tensor in checkpoint["state_dict"].items() if isinstance(checkpoint["state_dict"], dict) else ():
        if why := weight_problem(tensor, integers=True):
            raise LeanAgentError(f"{what}: {p}: '{name}' {why}")
    for key, kind in (("state_dict", dict), ("hyper_parameters", dict), ("epoch", int), ("global_step", int)):
        value = checkpoint.get(key)
        if key in checkpoint and (not isinstance(value, kind) or isinstance(value, bool)):
            raise LeanAgentError(f"{what}: {p}: '{key}' is a {type(value).__name__}, not a {kind.__name__}")
        if kind is int and key in checkpoint and value < 0:  # an edited file: resuming would misread its plan
            raise LeanAgentError(f"{what}: {p}: '{key}' is {value}; Lightning saves a count from 0 (a damaged or edited checkpoint)")
    return checkpoint


WEIGHT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def weight_problem(value: object, integers: bool = False) -> str | None:
    """Why an entry of a checkpoint, weights or Fisher file cannot be used, or None. The dtype is checked before
    the values: torch.isfinite has no kernel for float8, and a complex or float8 weight is not one we train."""
    if not isinstance(value, torch.Tensor):
        return f"is a {type(value).__name__}, not a tensor"
    floating = value.is_floating_point() or value.is_complex()
    if value.dtype not in WEIGHT_DTYPES and (floating or not integers):
        kinds = "float16, bfloat16, float32 or float64" + (" (or integer buffers)" if integers else "")
        return f"holds {str(value.dtype).removeprefix('torch.')} values; weights are {kinds}"
    if floating and not torch.isfinite(value).all():
        return "holds NaN or infinite values (a diverged or damaged file)"
    return None


def _damaged_entry(path: Path) -> str | None:
    """What of a torch zip checkpoint fails its CRC. A memory-mapped load reads tensors without checking them,
    so bytes damaged mid-file would otherwise load as wrong weights, or fail later inside Lightning's restore.
    Reads the file once; a legacy (non-zip) file has no checksums to check."""
    if not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None if bad is None else f"the bytes of {bad} do not match their checksum"


def check_resumable(checkpoint: dict[str, Any], path: str | os.PathLike) -> None:
    """A fit resumes the optimizer and the loops' progress: a checkpoint without them (a weights-only export,
    or one written by another tool) would restart the schedule or fail inside Lightning."""
    states = checkpoint.get("optimizer_states")
    if not isinstance(states, list) or not states:
        raise LeanAgentError(
            f"--ckpt_path: {path} holds no optimizer state (a weights-only checkpoint), so a fit cannot "
            "resume from it; give a checkpoint that a fit wrote (such as last.ckpt)"
        )
    if not isinstance(checkpoint.get("loops"), dict):
        raise LeanAgentError(f"--ckpt_path: {path} holds no training loop state, so a fit cannot resume from it; "
                             "give a checkpoint that a fit wrote (such as last.ckpt)")
    # What Lightning's restore walks as mappings (a damaged or edited file failed there with an AttributeError).
    loops, callbacks, schedulers = checkpoint["loops"], checkpoint.get("callbacks", {}), checkpoint.get("lr_schedulers", [])
    for key, ok in (("loops", all(isinstance(v, dict) and isinstance(v.get("state_dict", {}), dict) for v in loops.values())),
                    ("callbacks", isinstance(callbacks, dict) and all(isinstance(v, dict) for v in callbacks.values())),
                    ("lr_schedulers", isinstance(schedulers, list) and all(isinstance(v, dict) for v in schedulers))):
        if not ok:
            raise LeanAgentError(f"--ckpt_path: {path}: its '{key}' section is not what a fit writes (damaged or edited); "
                                 "give a checkpoint that a fit wrote (such as last.ckpt)")


def check_optimizer_state(checkpoint: dict[str, Any], shapes: list[torch.Size], path: str | os.PathLike | None) -> None:
    """A resumed AdamW state must be one for these parameters (in `parameters()` order): a damaged or foreign
    one fails inside Lightning's restore or, with moment tensors of other shapes, at the first step."""
    where = f"--ckpt_path: {path}" if path else "--ckpt_path"
    states = checkpoint.get("optimizer_states")
    if not isinstance(states, list) or not states:
        return  # nothing to restore (check_resumable refuses this for a resumed fit)
    state = states[0]
    groups = state.get("param_groups") if isinstance(state, dict) else None
    if not isinstance(groups, list) or len(groups) != 1 or not isinstance(groups[0], dict):
        raise LeanAgentError(f"{where}: its optimizer state is not one parameter group (damaged, or written by "
                             "another optimizer setup)")
    params = groups[0].get("params")
    if not isinstance(params, list) or len(params) != len(shapes):
        count = len(params) if isinstance(params, list) else "no"
        raise LeanAgentError(f"{where}: its optimizer state covers {count} parameters, this model has "
                             f"{len(shapes)} (damaged, or a checkpoint of another model)")
    moments = state.get("state")
    for index, entry in (moments.items() if isinstance(moments, dict) else [(None, moments)]):
        if not isinstance(index, int) or not 0 <= index < len(shapes) or not isinstance(entry, dict):
            raise LeanAgentError(f"{where}: its optimizer state is damaged (an entry for no parameter)")
        for key in ("exp_avg", "exp_avg_sq"):
            value = entry.get(key)
            if not isinstance(value, torch.Tensor) or value.shape != shapes[index]:
                found = tuple(value.shape) if isinstance(value, torch.Tensor) else "missing"
                raise LeanAgentError(f"{where}: its optimizer state is damaged: {key} of parameter {index} is "
                                     f"{found}, the parameter {tuple(shapes[index])}")


@dataclass(frozen=True)
class FitState:
    """The fit a checkpoint belongs to: its first epoch and optimizer step, its epoch budget, whether it ended."""

    start_epoch: int
    start_step: int
    max_epochs: int
    finished: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fit_state(checkpoint: dict[str, Any]) -> FitState:
    """What a checkpoint says about its fit; checkpoints from elsewhere count as finished at their epoch."""
    saved = checkpoint.get(FIT_STATE_KEY)
    if isinstance(saved, dict):
        try:
            return FitState(**{k: saved[k] for k in ("start_epoch", "start_step", "max_epochs", "finished")})
        except (KeyError, TypeError):
            pass
    epoch = int(checkpoint.get("epoch", -1))
    return FitState(start_epoch=0, start_step=0, max_epochs=epoch + 1, finished=True)


def next_fit_start(checkpoint: dict[str, Any]) -> tuple[int, int]:
    """(first epoch, first optimizer step) of a fit resumed from `checkpoint`.

    An unfinished fit continues its own plan; after a finished one, the next fit starts where it ended.
    """
    state = fit_state(checkpoint)
    if not state.finished:
        return state.start_epoch, state.start_step
    return int(checkpoint.get("epoch", -1)) + 1, int(checkpoint.get("global_step", 0))


def drop_per_fit_callback_state(checkpoint: dict[str, Any]) -> list[str]:
    """Before a fit that starts from the checkpoint of a finished fit (progressive training, a lifelong
    stage), forget the callback state that belongs to that earlier fit; returns the callbacks cleared.

    Lightning would restore EarlyStopping's best score, wait count and even its patience from the
    checkpoint, so a stage could stop after one epoch because an earlier repository scored higher. An
    interrupted fit keeps it: resuming that fit continues its early stopping exactly.
    """
    callbacks = checkpoint.get("callbacks")
    if not fit_state(checkpoint).finished or not isinstance(callbacks, dict):
        return []
    cleared = [key for key, state in callbacks.items()
               if str(key).startswith("EarlyStopping") or isinstance(state, dict) and {"wait_count", "best_score"} <= set(state)]
    for key in cleared:
        del callbacks[key]
    return cleared
