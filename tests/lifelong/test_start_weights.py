"""A lifelong run records the file its first fit starts from (`init_from`) and refuses to resume once the weights
behind that name have changed: its finished stages learned from the old ones, so it would be another run."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from leanagent.errors import LeanAgentError
from leanagent.lifelong.start_weights import check_start_weights, recorded_start_unchanged, start_weights
from leanagent.pretrained import SHIPPED_DIR
from tests.lifelong.test_lifelong_run import STAGE_ARGS, command, tiny_repositories

BASE = SHIPPED_DIR / "leanagent-base.safetensors"


def resolved(init_from: str | None) -> str:
    """A fit's --print_config output, as far as start_weights reads it."""
    return f"model:\n  class_path: leanagent.models.retriever.PremiseRetriever\n  init_args:\n    init_from: {json.dumps(init_from)}\n"


def perturbed_copy(source: Path, target: Path) -> None:
    """The same tensors and header, one value moved: a valid weights file with other weights."""
    with safe_open(str(source), framework="pt") as f:
        metadata, tensors = f.metadata(), {name: f.get_tensor(name).clone() for name in f.keys()}
    first = sorted(tensors)[0]
    tensors[first].view(-1)[0] += 1.0
    save_file(tensors, str(target), metadata=metadata)


def test_start_weights_names_the_shipped_file_and_its_digest(tmp_path):
    start = start_weights(resolved("leanagent-base"), tmp_path)
    assert start == {"init_from": "leanagent-base", "path": str(BASE),
                     "sha256": hashlib.sha256(BASE.read_bytes()).hexdigest()}
    assert start_weights(resolved(None), tmp_path) is None


def test_a_relative_init_from_is_read_where_the_stage_fit_runs(tmp_path):
    (tmp_path / "fit").mkdir()
    (tmp_path / "fit" / "mine.safetensors").write_bytes(BASE.read_bytes())
    assert start_weights(resolved("mine.safetensors"), tmp_path / "fit")["path"] == str(tmp_path / "fit" / "mine.safetensors")
    with pytest.raises(LeanAgentError, match="model.init_from: 'mine.safetensors' is neither"):
        start_weights(resolved("mine.safetensors"), tmp_path)


def test_changed_start_weights_are_refused_and_unchanged_ones_pass(tmp_path):
    weights = tmp_path / "start.safetensors"
    weights.write_bytes(BASE.read_bytes())
    recorded = start_weights(resolved(str(weights)), tmp_path)
    check_start_weights(recorded, dict(recorded), tmp_path)
    check_start_weights(None, recorded, tmp_path)  # a state.json from before the record: nothing to compare
    recorded_start_unchanged(recorded, tmp_path)
    perturbed_copy(BASE, weights)
    with pytest.raises(LeanAgentError, match=r"model.init_from: .*start.safetensors has changed since the run"):
        check_start_weights(recorded, start_weights(resolved(str(weights)), tmp_path), tmp_path)
    with pytest.raises(LeanAgentError, match="has changed since the run"):
        recorded_start_unchanged(recorded, tmp_path)
    weights.unlink()  # later stages start from checkpoints: a start file that is gone is not needed
    recorded_start_unchanged(recorded, tmp_path)


def test_the_same_weights_found_at_another_path_are_the_same_start(tmp_path):
    """A checkout moved or reinstalled elsewhere: the shipped name resolves to a new path, with the same bytes."""
    recorded = {**start_weights(resolved("leanagent-base"), tmp_path), "path": str(tmp_path / "old" / BASE.name)}
    check_start_weights(recorded, start_weights(resolved("leanagent-base"), tmp_path), tmp_path)
    with pytest.raises(LeanAgentError, match="has changed since the run"):
        check_start_weights({**recorded, "sha256": "0" * 64}, start_weights(resolved("leanagent-base"), tmp_path), tmp_path)


@pytest.mark.slow  # a real one-stage lifelong run, then the same command again
def test_a_finished_run_is_not_resumed_on_other_start_weights(tmp_path):
    repos = tiny_repositories(tmp_path / "repos")
    weights = tmp_path / "start.safetensors"
    weights.write_bytes(BASE.read_bytes())
    out = tmp_path / "out"
    args = command(repos, out, [*STAGE_ARGS, f"--model.init_args.init_from={weights}"], ewc=False)
    args[args.index("--repositories.names=[unionfind, assoc]")] = "--repositories.names=[unionfind]"
    first = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-4000:]
    state = json.loads((out / "state.json").read_text())
    assert state["start_weights"]["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

    perturbed_copy(BASE, weights)
    again = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2, again.stderr[-3000:]
    errors = [line for line in again.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(weights) in errors[0] and "has changed since the run" in errors[0], again.stderr[-3000:]
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # nothing written
