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

from leanagent.errors import LeanAgentError
from leanagent.ewc.fisher_file import load_fisher, read_fisher_metadata, read_fisher_tensors, save_fisher, weights_fingerprint

EWCForm = Literal["paper", "leanagent"]


class EWCPenalty:
    """F and theta* as plain tensors, deliberately not an nn.Module: as module buffers DDP would broadcast
    them from rank 0 on every step, and checkpoints would carry them."""

    def __init__(self, fisher: dict[str, torch.Tensor], theta_star: dict[str, torch.Tensor], lam: float, form: EWCForm = "paper") -> None:
        if form not in ("paper", "leanagent"):
            raise LeanAgentError(f"ewc_form must be 'paper' or 'leanagent', got {form!r}")
        if lam < 0:
            raise LeanAgentError(f"ewc_lambda must be non-negative, got {lam}")
        self.names = sorted(fisher)
        self.scale = lam / 2 if form == "paper" else lam
        self.fisher = {name: fisher[name].detach().float().clone() for name in self.names}
        self.theta_star = {name: theta_star[name].detach().float().clone() for name in self.names}
        self.source = "theta*"

    def to(self, device: torch.device | str) -> EWCPenalty:
        device = torch.device(device)
        if self.fisher and next(iter(self.fisher.values())).device != device:
            self.fisher = {k: v.to(device) for k, v in self.fisher.items()}
            self.theta_star = {k: v.to(device) for k, v in self.theta_star.items()}
        return self

    def differing(self, state_dict: dict[str, torch.Tensor]) -> list[str]:
        """Names whose tensor in `state_dict` is not theta*'s: a fit starting there is pulled back towards theta*."""
        return [n for n in self.names if n in state_dict and not torch.equal(state_dict[n].float(), self.theta_star[n].cpu())]

    def __call__(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        total = torch.zeros((), device=next(iter(params.values())).device)
        for name in self.names:
            diff = params[name].float() - self.theta_star[name]
            total = total + (self.fisher[name] * diff**2).sum()
        return self.scale * total


def load_theta_star(metadata: dict[str, str], fisher_path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """theta* as the file carries it, or (older files) from its source checkpoint; checked by fingerprint."""
    names = json.loads(metadata.get("parameter_names", "[]"))
    expected = metadata.get("weights_sha256")
    _, theta = read_fisher_tensors(fisher_path)
    where = f"{fisher_path}"
    if not theta:
        source = metadata.get("source_checkpoint")
        if not source:
            raise LeanAgentError(f"{fisher_path}: carries no theta* and names no source_checkpoint, so theta* is unknown")
        if not Path(source).is_file():
            raise LeanAgentError(f"{fisher_path}: carries no theta*, and its source checkpoint {source} is not found")
        from leanagent.checkpoint_files import load_checkpoint

        state = load_checkpoint(source, f"{fisher_path}: source checkpoint")["state_dict"]
        theta = {name: state[name] for name in names if name in state}
        where = f"{fisher_path}: the weights in {source}"
    theta = {name: theta[name] for name in names if name in theta}
    if len(theta) != len(names) or weights_fingerprint(theta) != expected:
        raise LeanAgentError(
            f"{where} are not the ones this Fisher was computed on (fingerprint mismatch); recompute the Fisher"
        )
    return theta


def load_ewc(fisher_path: str | os.PathLike, params: dict[str, torch.Tensor], lam: float, form: EWCForm = "paper") -> EWCPenalty:
    fisher, metadata = load_fisher(fisher_path, params)
    penalty = EWCPenalty(fisher, load_theta_star(metadata, fisher_path), lam, form)
    penalty.source = f"{fisher_path} (computed on {metadata.get('source_checkpoint', 'unknown weights')})"
    return penalty


def build_ewc(
    fisher_path: str | os.PathLike | None, lam: float, form: EWCForm, params: dict[str, torch.Tensor]
) -> EWCPenalty | None:
    """The retriever's EWC settings, checked: a penalty, or None when EWC is off (lambda 0)."""
    if form not in ("paper", "leanagent"):
        raise LeanAgentError(f"model.ewc_form must be 'paper' or 'leanagent', got {form!r}")
    if not (lam >= 0 and lam != float("inf")):
        raise LeanAgentError(f"model.ewc_lambda must be a finite non-negative number, got {lam}")
    if lam > 0 and not fisher_path:
        raise LeanAgentError(f"model.ewc_lambda is {lam} but model.fisher_path is not set: EWC needs a Fisher file")
    if lam == 0:
        return None
    return load_ewc(fisher_path, params, lam, form)


def combine_fisher(old_path: str | os.PathLike, new_path: str | os.PathLike, gamma: float, out_path: str | os.PathLike) -> None:
    """Online EWC: F = gamma * F_old + F_new, anchored at the new Fisher's weights (theta*)."""
    new_meta = read_fisher_metadata(new_path)
    new, theta = read_fisher_tensors(new_path)
    old, _ = load_fisher(old_path, new)
    combined = {name: gamma * old[name] + new[name] for name in new}
    metadata = {k: v for k, v in new_meta.items() if k != "parameter_names"}
    metadata.update({"online_gamma": str(gamma), "combined_from": json.dumps([str(old_path), str(new_path)])})
    save_fisher(out_path, combined, metadata, theta_star=theta or None)
