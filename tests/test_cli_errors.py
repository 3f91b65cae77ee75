"""Bad input through the real command line: one `error:` line naming the problem, exit code 2, no output."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, run_cli, theorem, toy_corpus, write_dataset

pytestmark = pytest.mark.slow  # real subprocesses

RETRIEVAL = str(REPO / "configs" / "retrieval.yaml")
FISHER = str(REPO / "configs" / "fisher.yaml")
ONE_CPU = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.enable_progress_bar=false"]


def assert_one_error(result, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1, result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def data(root: Path) -> list[str]:
    return [f"--data.data_path={root / 'random'}", f"--data.corpus_path={root / 'corpus.jsonl'}", "--data.max_seq_len=32"]


def test_malformed_corpus_line(tmp_path, toy_dataset):
    with open(toy_dataset / "corpus.jsonl", "a") as f:
        f.write('{"path": "E.lean", "imports": [\n')
    result = run_cli(["fit", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset)], cwd=tmp_path)
    assert_one_error(result, "corpus.jsonl:5: malformed JSON line")
    assert not (tmp_path / "checkpoints").exists()


def test_theorem_outside_the_corpus(tmp_path):
    root = write_dataset(tmp_path / "d", toy_corpus(), {"train": [theorem("Ghost.lean", "g", 1, [])]})
    result = run_cli(["fit", "--config", RETRIEVAL, *ONE_CPU, *data(root)], cwd=tmp_path)
    assert_one_error(result, "train.json: theorem [0] 'g': its file 'Ghost.lean' is not in the corpus")


def test_inconsistent_negatives(tmp_path, toy_dataset):
    result = run_cli(["fit", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), "--data.num_negatives=1", "--data.num_in_file_negatives=2"], cwd=tmp_path)
    assert_one_error(result, "num_in_file_negatives (2)")


def test_unknown_model_name_offline(tmp_path, toy_dataset, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = run_cli(["fit", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), "--model.init_args.model_name=no-such/model"], cwd=tmp_path)
    assert_one_error(result, "model_name 'no-such/model' is neither a built-in preset")


def test_validate_with_a_missing_checkpoint(tmp_path, toy_dataset):
    result = run_cli(["validate", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), f"--ckpt_path={tmp_path / 'none.ckpt'}"], cwd=tmp_path)
    assert_one_error(result, "checkpoint not found", "none.ckpt")


def test_validate_with_a_mismatched_checkpoint(tmp_path, toy_dataset, retriever_checkpoint):
    checkpoint = torch.load(retriever_checkpoint, weights_only=True)
    name = next(iter(checkpoint["state_dict"]))
    checkpoint["state_dict"][name] = torch.zeros(2, 2)
    bad = tmp_path / "bad.ckpt"
    torch.save(checkpoint, bad)
    result = run_cli(["validate", "--config", RETRIEVAL, *ONE_CPU, *data(toy_dataset), f"--ckpt_path={bad}",
                      "--model.init_args.model_name=byt5-tiny"], cwd=tmp_path)  # the fixture's architecture
    assert_one_error(result, f"--ckpt_path {bad} does not match the model", name)
    fisher = run_cli(["fit", "--config", FISHER, *ONE_CPU, *data(toy_dataset), f"--model.init_args.ckpt_path={bad}",
                      f"--model.init_args.output_path={tmp_path / 'fisher.safetensors'}", "--model.init_args.model_name=byt5-tiny"],
                     cwd=tmp_path)
    assert_one_error(fisher, f"{bad}: checkpoint does not match the model", name)
    assert not (tmp_path / "fisher.safetensors").exists()


def test_fisher_with_a_missing_checkpoint_writes_nothing(tmp_path, toy_dataset):
    out = tmp_path / "fisher.safetensors"
    result = run_cli(["fit", "--config", FISHER, *ONE_CPU, *data(toy_dataset), f"--model.init_args.ckpt_path={tmp_path / 'none.ckpt'}", f"--model.init_args.output_path={out}"], cwd=tmp_path)
    assert_one_error(result, "model.ckpt_path: checkpoint not found", "none.ckpt")
    assert not out.exists() and not list(tmp_path.glob(".fisher*"))
