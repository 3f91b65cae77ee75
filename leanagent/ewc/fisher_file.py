"""Fisher files: safetensors tensors named like the retriever's parameters, with metadata saying what they are.

A file also carries theta* (the weights the Fisher was computed on) under `theta_star/<name>`, so an
EWC run depends on nothing that later training may overwrite (such as `last.ckpt`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors import safe_open

from leanagent.checkpoint_files import weight_problem
from leanagent.errors import LeanAgentError
from leanagent.io import require_file, write_safetensors


def weights_fingerprint(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names, shapes and float32 values: identifies the weights (theta*) a Fisher belongs to."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu", torch.float32).contiguous()
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


THETA_PREFIX = "theta_star/"


def save_fisher(
    path: str | os.PathLike,
    fisher: dict[str, torch.Tensor],
    metadata: dict[str, object],
    theta_star: dict[str, torch.Tensor] | None = None,
) -> None:
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in fisher.items()}
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    meta["parameter_names"] = json.dumps(sorted(tensors))
    if theta_star is not None:
        meta["weights_sha256"] = weights_fingerprint(theta_star)
        tensors.update({THETA_PREFIX + name: t.detach().to("cpu", torch.float32).contiguous() for name, t in theta_star.items()})
    write_safetensors(path, tensors, meta)


def read_fisher_metadata(path: str | os.PathLike) -> dict[str, str]:
    p = Path(path)
    require_file(p, "Fisher file")
    try:
        with safe_open(str(p), framework="pt") as f:
            metadata = dict(f.metadata() or {})
    except Exception as e:  # safetensors raises several types for a damaged file
        raise LeanAgentError(f"{p}: not a readable safetensors Fisher file ({e})") from None
    found = metadata.get("format")
    if found is not None and not str(found).startswith("leanagent-fisher"):  # files of other kinds say what they are
        raise LeanAgentError(f"{p}: not a Fisher file (header format {found!r}, expected 'leanagent-fisher-v1'); "
                             "a Fisher file is what `fit --config configs/fisher.yaml` writes")
    try:
        names = json.loads(metadata.get("parameter_names", "[]"))
    except json.JSONDecodeError:
        names = None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise LeanAgentError(f"{p}: damaged Fisher metadata ('parameter_names' is not a JSON list of names)")
    return metadata


def check_state_dict(saved: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], what: str) -> None:
    """Same names and shapes, or one error naming the first difference (checkpoints and Fisher files)."""
    missing = sorted(set(expected) - set(saved))
    unexpected = sorted(set(saved) - set(expected))
    if missing or unexpected:
        raise LeanAgentError(
            f"{what} does not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    for name, tensor in expected.items():
        if not isinstance(saved[name], torch.Tensor):
            raise LeanAgentError(f"{what} does not match the model: '{name}' is a {type(saved[name]).__name__}, not a tensor")
        if tuple(saved[name].shape) != tuple(tensor.shape):
            raise LeanAgentError(
                f"{what} does not match the model: '{name}' has shape {tuple(saved[name].shape)}, "
                f"expected {tuple(tensor.shape)}"
            )


def read_fisher_tensors(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(Fisher, theta*) tensors of a file; theta* is empty for files written before it was embedded."""
    read_fisher_metadata(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as e:
        raise LeanAgentError(f"{path}: not a readable safetensors Fisher file ({e})") from None
    theta = {name[len(THETA_PREFIX):]: t for name, t in tensors.items() if name.startswith(THETA_PREFIX)}
    fisher = {name: t for name, t in tensors.items() if not name.startswith(THETA_PREFIX)}
    return fisher, theta


def load_fisher(path: str | os.PathLike, expected: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Load a Fisher file, refusing one whose names or shapes differ from `expected`'s, or whose values
    could not be a Fisher (NaN, infinite or negative): those would train the model into garbage."""
    metadata = read_fisher_metadata(path)
    fisher, _ = read_fisher_tensors(path)
    check_state_dict(fisher, expected, f"{path}: Fisher")
    for name, tensor in fisher.items():
        if why := weight_problem(tensor):
            raise LeanAgentError(f"{path}: Fisher '{name}' {why}")
        if (tensor < 0).any():
            raise LeanAgentError(f"{path}: Fisher '{name}' holds negative values (a diagonal Fisher is a mean of squares)")
    return fisher, metadata
