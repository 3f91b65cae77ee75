"""bf16 only where the CPU computes it natively: the configured precision otherwise runs in float32, and says so."""

from __future__ import annotations

import pytest
import torch

from leanagent import compat
from leanagent.cli import LeanAgentCLI
from leanagent.lifelong.evaluation import evaluation_trainer
from leanagent.precision import describe_fallback, run_precision
from tests.conftest import REPO


@pytest.fixture
def emulated_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(compat, "cpu_has_native_bf16", lambda: False)


def test_bf16_on_a_cpu_without_it_runs_in_float32(emulated_bf16):
    for precision in ("bf16-mixed", "bf16-true", "bf16"):
        assert run_precision(precision, "cpu") == "32-true"
        assert run_precision(precision, "auto") == "32-true"  # auto without a GPU is the CPU
        assert run_precision(precision, "cpu", "always") == precision
    for precision in ("32-true", "16-mixed", 64):
        assert run_precision(precision, "cpu") == precision
    assert "--cpu_bf16=always" in describe_fallback("bf16-mixed", "32-true")
    assert describe_fallback("bf16-mixed", "bf16-mixed") is None


def test_bf16_is_kept_where_it_is_native_or_on_a_gpu(monkeypatch):
    monkeypatch.setattr(compat, "cpu_has_native_bf16", lambda: True)
    assert run_precision("bf16-mixed", "cpu") == "bf16-mixed"
    monkeypatch.setattr(compat, "cpu_has_native_bf16", lambda: False)
    assert run_precision("bf16-mixed", "gpu") == "bf16-mixed"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert run_precision("bf16-mixed", "auto") == "bf16-mixed"


def _trainer_precision(args):
    cli = LeanAgentCLI(args=["--config", str(REPO / "configs/retrieval.yaml"), "--trainer.devices=1",
                             "--trainer.strategy=auto", *args], run=False)
    assert cli.config.trainer.precision == "bf16-mixed"  # what config.yaml saves: the same file means bf16 on a GPU
    return cli.trainer.precision


def test_the_cli_trains_in_float32_on_such_a_cpu_and_names_the_way_back(clean_env, emulated_bf16, caplog):
    caplog.set_level("INFO", logger="leanagent")
    assert _trainer_precision([]) == "32-true"
    assert "precision bf16-mixed -> 32-true" in caplog.text and "--cpu_bf16=always" in caplog.text
    assert _trainer_precision(["--cpu_bf16=always"]) == "bf16-mixed"
    assert evaluation_trainer("bf16-mixed").precision == "32-true"


def test_the_cli_keeps_bf16_on_a_cpu_that_has_it(clean_env, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(compat, "cpu_has_native_bf16", lambda: True)
    assert _trainer_precision([]) == "bf16-mixed"
    assert evaluation_trainer("bf16-mixed").precision == "bf16-mixed"
