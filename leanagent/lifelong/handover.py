"""What a lifelong stage hands over to the next: the checkpoint of its fit that `resume_from` names, marked as
the end of a fit, its weights pulled back toward the ones it started from where `fine_tuned_share` < 1
(WiSE-FT, Wortsman et al. 2022).

A small encoder fine-tuned on one repository overwrites what it knew about the others, the ones it has
not reached yet included. Interpolating the fine-tuned weights with the stage's start keeps most of the
new repository's gain for much of what was there before, without data from earlier repositories.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import torch

from leanagent.checkpoint_files import FIT_STATE_KEY, fit_state, load_checkpoint
from leanagent.errors import LeanAgentError
from leanagent.io import atomic_write

log = logging.getLogger(__name__)


def handover_checkpoint(
    index: int, fit_dir: Path, last: Path, stage_dir: Path, resume_from: str, share: float, began_from: str | None
) -> Path:
    """The checkpoint the next stage starts from, its Fisher is computed on and this stage is evaluated with.

    `best` (LeanAgent) is the best-by-Recall@10_val file of the stage's fit; it may come from before the fit's
    last epoch, so a copy marked as the end of a fit is handed over, and the next stage trains `epochs_per_repo`
    epochs from it rather than finishing this stage's plan. Below a share of 1 the copy's weights are pulled
    back toward `began_from`, the weights the stage started from (None: random weights, nothing to pull toward).
    """
    if not last.is_file():
        raise LeanAgentError(f"stage {index}: fit wrote no {last}")
    source, handover = last, stage_dir / "handover.ckpt"
    if resume_from == "best":
        callbacks = load_checkpoint(last, f"stage {index} last checkpoint").get("callbacks", {})
        named = [Path(c["best_model_path"]) for c in callbacks.values() if isinstance(c, dict) and c.get("best_model_path")]
        if named:
            source, handover = _recorded_best(index, named[0], fit_dir, last), stage_dir / "best.ckpt"
        else:
            log.info("stage %d recorded no best checkpoint (no validation?): handing over its last", index)
    interpolate = share < 1.0 and began_from is not None
    if source == last and not interpolate:
        log.info("stage %d hands over its last checkpoint %s", index, last)
        return last
    checkpoint = load_checkpoint(source, f"stage {index} checkpoint")
    checkpoint[FIT_STATE_KEY] = replace(fit_state(checkpoint), finished=True).as_dict()
    if interpolate:
        interpolate_checkpoint(checkpoint, began_from, share, f"stage {index} checkpoint {source}")
    atomic_write(handover, lambda tmp: torch.save(checkpoint, tmp))
    kept = f", {share:g} of the way from {began_from}" if interpolate else ""
    log.info("stage %d hands over %s (as %s%s)", index, source.name, handover.name, kept)
    return handover


def _recorded_best(index: int, named: Path, fit_dir: Path, last: Path) -> Path:
    """The best checkpoint last.ckpt names: Lightning records an absolute path, so an output_dir moved since (a
    rerun on another mount) finds it by name beside last.ckpt. Missing, it is refused: last.ckpt would hand over
    other weights than the uninterrupted run did."""
    for candidate in (named if named.is_absolute() else fit_dir / named, last.parent / named.name):
        if candidate.is_file():
            return candidate
    raise LeanAgentError(f"stage {index}: its best checkpoint {named}, which {last} names, is missing; put it back, "
                         f"or delete {fit_dir.parent} to train the stage again")


def interpolate_checkpoint(checkpoint: dict, start: str, share: float, where: str) -> None:
    """In place: every encoder tensor of `checkpoint` becomes `share * fine-tuned + (1 - share) * start`.

    `start` is what the stage's fit started from, as `model.init_from` names it (a shipped name, a weights
    file or a checkpoint); it is read through the same loader, so a start of another shape is refused.
    """
    from leanagent.models.retriever import PremiseRetriever

    if not 0.0 < share <= 1.0:
        raise LeanAgentError(f"fine_tuned_share must be in (0, 1], got {share!r}")
    hparams = checkpoint.get("hyper_parameters") or {}
    state = checkpoint.get("state_dict")
    if not isinstance(state, dict) or "model_name" not in hparams:
        raise LeanAgentError(f"{where}: not a retriever checkpoint (no state_dict or model_name)")
    start_state = PremiseRetriever(model_name=hparams["model_name"], init_from=start).state_dict()
    encoder = [name for name in state if name.startswith("encoder.")]
    if not encoder or any(name not in start_state or start_state[name].shape != state[name].shape for name in encoder):
        raise LeanAgentError(f"{where}: its encoder and the start weights {start} differ in shape")
    with torch.no_grad():
        for name in encoder:
            tuned = state[name]
            if tuned.is_floating_point():
                mixed = share * tuned.float() + (1.0 - share) * start_state[name].float()
                state[name] = mixed.to(tuned.dtype)
