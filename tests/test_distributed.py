import os
from datetime import timedelta

import pytest
import torch

from leanagent import distributed
from leanagent.errors import LeanAgentError


def test_one_year_is_leanagents_364_days():
    assert distributed.ONE_YEAR == timedelta(seconds=7 * 24 * 60 * 60 * 52) == timedelta(days=364)
    assert distributed.default_strategy()["init_args"]["timeout"] == "364 days, 0:00:00"


def test_nccl_variables_in_milliseconds(monkeypatch):
    monkeypatch.delenv("NCCL_TIMEOUT", raising=False)
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    distributed.set_nccl_env(timedelta(seconds=90))
    assert os.environ["NCCL_TIMEOUT"] == "90000"
    assert os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"


def test_too_few_gpus_names_the_override(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(LeanAgentError, match=r"trainer.devices is 4 but this machine has 2 GPU\(s\): run with --trainer.devices=2"):
        distributed.check_gpu_count("auto", 4)
    distributed.check_gpu_count("auto", 2)
    distributed.check_gpu_count("cpu", 4)


def test_no_gpu_means_cpu_ranks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    distributed.check_gpu_count("auto", 4)
    assert distributed.uses_cpu("auto") and distributed.uses_cpu("cpu")


def test_cpu_ranks_share_the_cores(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(distributed, "local_cpu_count", lambda: 16)
        assert distributed.limit_cpu_threads(4) == 4 and torch.get_num_threads() == 4
        monkeypatch.setattr(distributed, "local_cpu_count", lambda: 2)
        assert distributed.limit_cpu_threads(4) == 1
    finally:
        torch.set_num_threads(before)


def test_timeout_values():
    assert distributed.parse_timeout(timedelta(hours=1)) == timedelta(hours=1)
    assert distributed.parse_timeout(60) == timedelta(minutes=1)
    with pytest.raises(LeanAgentError):
        distributed.parse_timeout("soon")
