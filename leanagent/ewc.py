"""Elastic Weight Consolidation: a quadratic pull towards the weights a Fisher file was computed on.

Penalty, paper form (Kirkpatrick et al.; LeanAgent's paper):  lambda/2 * sum_i F_i (theta_i - theta*_i)^2
LeanAgent's code drops the 1/2 (`form="leanagent"`):           lambda   * sum_i F_i (theta_i - theta*_i)^2
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from leanagent.errors import LeanAgentError
from leanagent.fisher_file import load_fisher, read_fisher_metadata, save_fisher, weights_fingerprint

EWCForm = Literal["paper", "leanagent"]


class EWCPenalty(nn.Module):
    """Holds F and theta* as non-persistent buffers, so checkpoints stay loadable without EWC."""

    def __init__(self, fisher: dict[str, torch.Tensor], theta_star: dict[str, torch.Tensor], lam: float, form: EWCForm = "paper") -> None:
        super().__init__()
        if form not in ("paper", "leanagent"):
            raise LeanAgentError(f"ewc_form must be 'paper' or 'leanagent', got {form!r}")
        if lam < 0:
            raise LeanAgentError(f"ewc_lambda must be non-negative, got {lam}")
        self.names = sorted(fisher)
        self.scale = lam / 2 if form == "paper" else lam
        for i, name in enumerate(self.names):
            self.register_buffer(f"fisher_{i}", fisher[name].detach().float().clone(), persistent=False)
            self.register_buffer(f"theta_{i}", theta_star[name].detach().float().clone(), persistent=False)

    def forward(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        total = torch.zeros((), device=self.fisher_0.device)
        for i, name in enumerate(self.names):
            diff = params[name].float() - getattr(self, f"theta_{i}")
            total = total + (getattr(self, f"fisher_{i}") * diff**2).sum()
        return self.scale * total


def load_theta_star(metadata: dict[str, str], fisher_path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The weights named by a Fisher file's metadata, checked against the fingerprint it recorded."""
    source = metadata.get("source_checkpoint")
    if not source:
        raise LeanAgentError(f"{fisher_path}: metadata names no source_checkpoint, so theta* is unknown")
    path = Path(source)
    if not path.is_file():
        raise LeanAgentError(f"{fisher_path}: its source checkpoint {source} (theta*) is not found")
    state = torch.load(path, map_location="cpu", weights_only=True).get("state_dict", {})
    expected = metadata.get("weights_sha256")
    names = json.loads(metadata.get("parameter_names", "[]"))
    theta = {name: state[name] for name in names if name in state}
    if len(theta) != len(names) or weights_fingerprint(theta) != expected:
        raise LeanAgentError(
            f"{fisher_path}: the weights in {source} are not the ones this Fisher was computed on "
            "(fingerprint mismatch); recompute the Fisher or point to the original checkpoint"
        )
    return theta


def load_ewc(fisher_path: str | os.PathLike, params: dict[str, torch.Tensor], lam: float, form: EWCForm = "paper") -> EWCPenalty:
    fisher, metadata = load_fisher(fisher_path, params)
    return EWCPenalty(fisher, load_theta_star(metadata, fisher_path), lam, form)


def combine_fisher(old_path: str | os.PathLike, new_path: str | os.PathLike, gamma: float, out_path: str | os.PathLike) -> None:
    """Online EWC: F = gamma * F_old + F_new, anchored at the new Fisher's weights (theta*)."""
    new_meta = read_fisher_metadata(new_path)
    from safetensors.torch import load_file

    new = load_file(str(new_path))
    old, _ = load_fisher(old_path, new)
    combined = {name: gamma * old[name] + new[name] for name in new}
    metadata = {k: v for k, v in new_meta.items() if k != "parameter_names"}
    metadata.update({"online_gamma": str(gamma), "combined_from": json.dumps([str(old_path), str(new_path)])})
    save_fisher(out_path, combined, metadata)
