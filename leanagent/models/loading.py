"""A trained retriever from its checkpoint, outside a fit: for the Fisher pass, evaluation and tools."""

from __future__ import annotations

import inspect
from pathlib import Path

from leanagent.checkpoint_files import load_checkpoint
from leanagent.errors import LeanAgentError
from leanagent.models.retriever import PremiseRetriever


def load_retriever(
    ckpt_path: str | Path, model_name: str | None = None, what: str = "retriever checkpoint"
) -> PremiseRetriever:
    """A retriever from a Lightning checkpoint, loaded with weights_only=True (no pickle code runs).

    Settings of a run (EWC of a stage) are left out: the retriever comes back as the checkpoint's weights.
    `what` begins each error: the setting that named the file, where there is one.
    """
    path = Path(ckpt_path)
    checkpoint = load_checkpoint(path, what)
    hparams = dict(checkpoint.get("hyper_parameters") or {})
    if "state_dict" not in checkpoint or "model_name" not in hparams:
        raise LeanAgentError(f"{what}: {path}: not a PremiseRetriever checkpoint (no state_dict or hyper_parameters)")
    if model_name is not None and hparams["model_name"] != model_name:
        raise LeanAgentError(
            f"{what}: {path} was trained with model_name '{hparams['model_name']}', but model.model_name is '{model_name}'"
        )
    known = set(inspect.signature(PremiseRetriever.__init__).parameters) - {"self", "fisher_path", "ewc_lambda", "ewc_form"}
    retriever = PremiseRetriever(**{k: v for k, v in hparams.items() if k in known})
    try:
        retriever.on_load_checkpoint(checkpoint)
    except LeanAgentError as e:  # which checkpoint: the model does not know where its dict came from
        raise LeanAgentError(f"{what}: {path}: {e}") from None
    retriever.load_state_dict(checkpoint["state_dict"])
    return retriever
