"""LeanAgent's distributed settings: the one-year collective timeout, NCCL variables, the DDP strategy, CPU threads.

LeanAgent sets `NCCL_TIMEOUT` and a 364-day `DDPStrategy(timeout=...)` so that long corpus
embedding on one rank never times out the others. Only the process-group timeout bounds a
collective; NCCL and PyTorch never read `NCCL_TIMEOUT`, which is set for compatibility.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

import torch
from jsonargparse import Namespace

from leanagent import compat
from leanagent.errors import LeanAgentError

log = logging.getLogger("leanagent")

ONE_YEAR = timedelta(seconds=7 * 24 * 60 * 60 * 52)
DDP_CLASS_PATH = "pytorch_lightning.strategies.DDPStrategy"


def default_strategy(timeout: timedelta = ONE_YEAR) -> dict[str, Any]:
    """The strategy as a class_path/init_args value: printable by --print_config and serialisable in config.yaml."""
    return {"class_path": DDP_CLASS_PATH, "init_args": {"timeout": str(timeout)}}


def set_nccl_env(timeout: timedelta) -> None:
    """Must run before any process group exists; children inherit os.environ."""
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    os.environ["NCCL_TIMEOUT"] = str(int(timeout.total_seconds() * 1000))


def parse_timeout(value: Any) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, (int, float)):
        return timedelta(seconds=value)
    raise LeanAgentError(f"trainer.strategy.init_args.timeout must be a duration like '364 days, 0:00:00', got {value!r}")


def is_ddp_class(class_path: str) -> bool:
    return class_path.rsplit(".", 1)[-1] == "DDPStrategy"


def local_cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def limit_cpu_threads(processes_per_node: int) -> int:
    """N CPU ranks on one machine share its cores instead of each starting one thread per core."""
    threads = max(1, local_cpu_count() // max(1, processes_per_node))
    torch.set_num_threads(threads)
    return threads


def check_gpu_count(accelerator: str, devices: Any) -> None:
    """Lightning's own message for too few GPUs does not say what to change; this one does."""
    if accelerator not in ("auto", "gpu", "cuda") or not isinstance(devices, int) or devices <= 0:
        return
    if not torch.cuda.is_available():
        return
    available = torch.cuda.device_count()
    if devices > available:
        raise LeanAgentError(
            f"trainer.devices is {devices} but this machine has {available} GPU(s): "
            f"run with --trainer.devices={available} (or --trainer.accelerator=cpu to use {devices} CPU ranks)"
        )


def uses_cpu(accelerator: str) -> bool:
    return accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())


def process_group_timeout() -> timedelta | None:
    """The timeout the live default process group was created with, read back from its backend."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return compat.process_group_timeout(dist.group.WORLD)


def check_device_count(devices: Any) -> None:
    """Lightning takes 0 and -2 for "no device" and fails later, or never."""
    value = devices
    if isinstance(devices, str) and devices.lstrip("-").isdigit():
        value = int(devices)
    if isinstance(value, int) and (value == 0 or value < -1):
        raise LeanAgentError(f"trainer.devices must be a positive number of devices, -1 or 'auto', got {devices!r}")


def configure_distributed(config: Namespace) -> None:
    """Runs on every rank (Lightning's DDP re-executes the command): env, strategy, threads, GPU count."""
    trainer = config.trainer
    timeout = ONE_YEAR
    strategy = trainer.strategy
    if strategy is None:
        trainer.strategy = Namespace(default_strategy(ONE_YEAR))
        strategy = trainer.strategy
    if isinstance(strategy, (Namespace, dict)) and is_ddp_class(str(strategy.get("class_path", ""))):
        init_args = strategy.get("init_args") or Namespace()
        if init_args.get("timeout") is None:
            init_args["timeout"] = ONE_YEAR
        timeout = parse_timeout(init_args["timeout"])
        init_args["timeout"] = timeout
        strategy["init_args"] = init_args
    else:
        name = strategy if isinstance(strategy, str) else strategy.get("class_path", strategy)
        log.info("trainer.strategy %r was named explicitly: the one-year DDPStrategy was not injected", name)
    set_nccl_env(timeout)
    log.info(
        "rank %s: TORCH_NCCL_ASYNC_ERROR_HANDLING=%s NCCL_TIMEOUT=%s (ms)",
        os.environ.get("LOCAL_RANK", "0"), os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"], os.environ["NCCL_TIMEOUT"],
    )

    accelerator = str(trainer.accelerator)
    check_device_count(trainer.devices)
    check_gpu_count(accelerator, trainer.devices)
    devices = trainer.devices
    if uses_cpu(accelerator) and isinstance(devices, int) and devices > 1:
        limit_cpu_threads(devices)
