"""With the encoder's hard negatives, each lifelong stage mines them with the weights it starts from: the
first with the run's start (`init_from`), a later one with the checkpoint the previous stage handed over."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from leanagent.data.datamodule import RetrievalDataModule
from leanagent.data.hard_negatives import pools_key
from leanagent.models.encoder_negatives import weights_key
from leanagent.models.retriever import PremiseRetriever
from tests.lifelong.test_lifelong_run import command, tiny_repositories

pytestmark = pytest.mark.slow  # real subprocesses

SEQ = 32
ARGS = ["--trainer.accelerator=cpu", "--trainer.devices=1", f"--data.max_seq_len={SEQ}", "--data.batch_size=2",
        "--trainer.accumulate_grad_batches=1", "--trainer.enable_model_summary=false",
        "--data.hard_negatives_by=encoder", "--data.num_hard_negatives=1"]


def _pools_file(cache: Path, repo: Path, init_from: str) -> Path:
    """Where the cache keeps the pools that the encoder of `init_from` mines for `repo`'s training states."""
    data = RetrievalDataModule(data_path=str(repo / "random"), corpus_path=str(repo / "corpus.jsonl"),
                               model_name="byt5-mini", max_seq_len=SEQ, batch_size=2)
    encoder = PremiseRetriever(model_name="byt5-mini", max_seq_len=SEQ, init_from=init_from)
    key = pools_key(data.states("train"), data.hard_negative_pool, data.corpus_fingerprint, weights_key(encoder))
    return cache / f"{key}.hard-negatives.npy"


def test_each_stage_mines_with_the_weights_it_starts_from(tmp_path, monkeypatch):
    repos = tiny_repositories(tmp_path / "repos")
    cache = tmp_path / "cache"
    monkeypatch.setenv("LEANAGENT_TOKEN_CACHE", str(cache))
    out = tmp_path / "out"
    result = subprocess.run(command(repos, out, ARGS, ewc=False), cwd=tmp_path, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    stages = json.loads((out / "state.json").read_text())["stages"]
    handed_over = stages[0]["checkpoint"]

    mined = set(cache.glob("*.hard-negatives.npy"))
    assert len(mined) == 2, sorted(p.name for p in mined)  # one set of pools per stage
    assert _pools_file(cache, repos / "unionfind", "leanagent-base") in mined
    assert _pools_file(cache, repos / "assoc", handed_over) in mined
    assert _pools_file(cache, repos / "assoc", "leanagent-base") not in mined  # not the run's start weights
