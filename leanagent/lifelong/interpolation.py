"""A stage's weights pulled back toward the weights it started from (WiSE-FT, Wortsman et al. 2022).

A small encoder fine-tuned on one repository overwrites what it knew about the others, the ones it has
not reached yet included. Interpolating the fine-tuned weights with the stage's start keeps most of the
new repository's gain for much of what was there before, without data from earlier repositories.
"""

from __future__ import annotations

import torch

from leanagent.errors import LeanAgentError


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
