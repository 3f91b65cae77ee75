"""Retrievers that ship with the project, and loading encoder weights to start a fit from.

A shipped retriever is `<name>.safetensors` (the encoder's tensors under the names checkpoints use,
`encoder.t5...`, with its `model_name` in the header) beside `<name>.json`, the record of how it was
trained: the command, the data fingerprints and what it measured. Configs start from one with
`model.init_args.init_from: leanagent-base`, as LeanAgent starts from ReProver's retriever.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from leanagent.checkpoint_files import weight_problem
from leanagent.errors import LeanAgentError
from leanagent.ewc.fisher_file import check_state_dict
from leanagent.io import file_sha256, missing_error

SHIPPED_DIR = Path(__file__).resolve().parent
WEIGHTS_FORMAT = "leanagent-retriever-encoder"


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.safetensors"))


def resolve(init_from: str, relative_to: Path | None = None) -> Path:
    """A shipped name, a .safetensors file or a Lightning .ckpt; anything else is one clear error.

    A relative path is taken from `relative_to` (default: the working directory), where the fit that loads it runs.
    """
    shipped = SHIPPED_DIR / f"{init_from}.safetensors"
    if shipped.is_file():
        return shipped
    path = Path(init_from).expanduser()
    if relative_to is not None and not path.is_absolute():
        path = relative_to / path
    if path.is_file():
        return path
    raise missing_error(
        path, "model.init_from: ",
        f"model.init_from: '{init_from}' is neither a shipped retriever ({', '.join(shipped_names()) or 'none installed'}) "
        "nor an existing .safetensors or .ckpt file",
    )


def check_shipped_file(path: Path) -> None:
    """A shipped file must be the bytes its record names: safetensors has no checksum of its own, so a damaged
    copy would load as other weights without a word."""
    record_path = path.with_suffix(".json")
    if path.parent != SHIPPED_DIR or not record_path.is_file():
        return
    try:
        expected = json.loads(record_path.read_text(encoding="utf-8")).get("weights_sha256")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        raise LeanAgentError(f"model.init_from: {record_path} is not a readable record ({type(e).__name__})") from None
    actual = file_sha256(path)
    if expected is not None and actual != expected:
        raise LeanAgentError(
            f"model.init_from: {path} is damaged: its SHA-256 is {actual[:16]}..., {record_path.name} "
            f"records {str(expected)[:16]}... (restore it: git checkout -- {path.name}, or reinstall the project)"
        )


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], str | None]:
    """(encoder tensors, model_name or None) of a weights file or checkpoint, read without running pickle code."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                metadata = f.metadata() or {}
                tensors = {name: f.get_tensor(name) for name in f.keys()}
        except Exception as e:  # truncated or damaged: safetensors raises several types
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            raise LeanAgentError(f"model.init_from: {path} is not a readable safetensors file ({first})") from None
        if metadata.get("format") != WEIGHTS_FORMAT:
            raise LeanAgentError(
                f"model.init_from: {path} is not a retriever weights file (header format "
                f"{metadata.get('format')!r}, expected {WEIGHTS_FORMAT!r})"
            )
        return tensors, metadata.get("model_name")
    from leanagent.checkpoint_files import load_checkpoint

    checkpoint = load_checkpoint(path, "model.init_from")
    tensors = {k: v for k, v in checkpoint["state_dict"].items() if k.startswith("encoder.")}
    return tensors, (checkpoint.get("hyper_parameters") or {}).get("model_name")


def load_encoder(
    init_from: str, model_name: str, expected: dict[str, torch.Tensor], aliases: set[str] = frozenset()
) -> dict[str, torch.Tensor]:
    """The tensors to start from, checked against the model's `expected` names and shapes.

    `aliases` are further state-dict names of the same tensors (T5 ties `shared` and `embed_tokens`),
    which a checkpoint holds too.
    """
    path = resolve(init_from)
    check_shipped_file(path)
    tensors, saved_name = read_weights(path)
    tensors = {name: t for name, t in tensors.items() if name in expected or name not in aliases}
    if saved_name is not None and saved_name != model_name:
        raise LeanAgentError(
            f"model.init_from: {path} holds a '{saved_name}' encoder, but model.model_name is '{model_name}'"
            " (model.init_from=null trains it from random weights)"
        )
    check_state_dict(tensors, expected, f"model.init_from: {path} ('{model_name}' encoder)")
    for name in expected:  # integers, cast to float, would start the fit from other weights
        if why := weight_problem(tensors[name]):
            raise LeanAgentError(f"model.init_from: {path}: '{name}' {why}")
    return tensors


def save_encoder(path: str | os.PathLike, tensors: dict[str, torch.Tensor], model_name: str) -> None:
    """Write encoder tensors as a weights file `load_encoder` accepts (temporary name, then rename)."""
    from leanagent.io import write_safetensors

    contiguous = {name: t.detach().float().contiguous().cpu() for name, t in tensors.items()}
    write_safetensors(path, contiguous, {"format": WEIGHTS_FORMAT, "model_name": model_name})
