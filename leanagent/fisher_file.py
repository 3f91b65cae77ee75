"""Fisher files: safetensors tensors named like the retriever's parameters, with metadata saying what they are."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from leanagent.errors import LeanAgentError
from leanagent.io import atomic_write


def weights_fingerprint(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names, shapes and float32 values: identifies the weights (theta*) a Fisher belongs to."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu", torch.float32).contiguous()
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def save_fisher(path: str | os.PathLike, fisher: dict[str, torch.Tensor], metadata: dict[str, object]) -> None:
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in fisher.items()}
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    meta["parameter_names"] = json.dumps(sorted(tensors))
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=meta))


def read_fisher_metadata(path: str | os.PathLike) -> dict[str, str]:
    p = Path(path)
    if not p.is_file():
        raise LeanAgentError(f"Fisher file not found: {p}")
    try:
        with safe_open(str(p), framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception as e:  # safetensors raises several types for a damaged file
        raise LeanAgentError(f"{p}: not a readable safetensors Fisher file ({e})") from None


def check_state_dict(saved: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], what: str) -> None:
    """Same names and shapes, or one error naming the first difference (checkpoints and Fisher files)."""
    missing = sorted(set(expected) - set(saved))
    unexpected = sorted(set(saved) - set(expected))
    if missing or unexpected:
        raise LeanAgentError(
            f"{what} does not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    for name, tensor in expected.items():
        if tuple(saved[name].shape) != tuple(tensor.shape):
            raise LeanAgentError(
                f"{what} does not match the model: '{name}' has shape {tuple(saved[name].shape)}, "
                f"expected {tuple(tensor.shape)}"
            )


def load_fisher(path: str | os.PathLike, expected: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Load a Fisher file, refusing one whose parameter names or shapes differ from `expected`'s."""
    metadata = read_fisher_metadata(path)
    with safe_open(str(path), framework="pt") as f:
        fisher = {name: f.get_tensor(name) for name in f.keys()}
    check_state_dict(fisher, expected, f"{path}: Fisher")
    return fisher, metadata
