"""Test-only helpers: callbacks loaded by real-process tests with `--trainer.callbacks+=tests.helpers.<Name>`,
and functions the tests share that the package itself does not need."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback

if TYPE_CHECKING:
    from leanagent.models.fisher import FisherInformation


class SleepInStep(Callback):
    """Global rank `$LEANAGENT_TEST_SLEEP_RANK` sleeps inside train step `$LEANAGENT_TEST_SLEEP_STEP` (default 2), before backward."""

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        rank = os.environ.get("LEANAGENT_TEST_SLEEP_RANK")
        step = int(os.environ.get("LEANAGENT_TEST_SLEEP_STEP", "2"))
        if rank is not None and trainer.global_rank == int(rank) and trainer.fit_loop.epoch_loop.batch_idx == step:
            time.sleep(3600)


class SignalAtStep(Callback):
    """Rank 0 sends itself `signal_name` once the global step reaches `step`, as a scheduler would."""

    def __init__(self, step: int, signal_name: str = "SIGTERM") -> None:
        self.step = step
        self.signum = signal.Signals[signal_name]
        self.sent = False

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        if trainer.global_rank == 0 and not self.sent and trainer.global_step >= self.step:
            self.sent = True
            os.kill(os.getpid(), self.signum)


class PauseInEvaluation(Callback):
    """Rank 0's first validation or test batch (not the sanity check) touches `ready`, then sleeps `seconds`:
    a window for a signal inside Lightning's evaluation loop. Later batches run as usual."""

    def __init__(self, ready: str, seconds: float = 30.0) -> None:
        self.ready = ready
        self.seconds = seconds
        self.paused = False

    def _pause(self, trainer: pl.Trainer) -> None:
        if self.paused or trainer.global_rank != 0 or trainer.sanity_checking:
            return
        self.paused = True
        open(self.ready, "w").close()
        time.sleep(self.seconds)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._pause(trainer)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._pause(trainer)


class PauseBesideACollective(Callback):
    """At the first test batch rank 1 touches `ready` and sleeps `seconds` (in Python, where a signal handler
    runs at once) while rank 0 is already waiting inside a collective for it (in C, where a handler waits
    until the collective returns); then rank 1 joins the collective. A signal to every rank now finds them
    in those two places."""

    def __init__(self, ready: str, seconds: float = 60.0) -> None:
        self.ready = ready
        self.seconds = seconds
        self.done = False

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        import torch.distributed as dist

        if self.done:
            return
        self.done = True
        if trainer.global_rank == 1:
            open(self.ready, "w").close()
            time.sleep(self.seconds)
        dist.all_gather_object([None] * trainer.world_size, trainer.global_rank)


def pause_lifelong_evaluations(ready: str, seconds: float = 30.0) -> None:
    """In this process, the lifelong runner's in-process evaluations get a `PauseInEvaluation` (its stages,
    separate processes, are untouched). For `python -c` wrappers of main.py in real-process tests."""
    from leanagent.lifelong import evaluation

    make = evaluation.evaluation_trainer

    def paused(precision: str = "32-true") -> pl.Trainer:
        trainer = make(precision)
        trainer.callbacks.append(PauseInEvaluation(ready, seconds))
        return trainer

    evaluation.evaluation_trainer = paused


def signal_when_ready(command: list[str], cwd: Path, ready: Path, signal_name: str, to_group: bool,
                      wait: float = 600) -> tuple[int, str]:
    """Start `command` (PYTHONPATH = the repository) in a session of its own; once it creates `ready`, send it
    `signal_name`: to its whole process group (a terminal's Ctrl-C) or to it alone (`kill PID`). Returns its exit
    code and stderr (from a file, not a pipe, which a long run would fill); asserts `ready` appeared."""
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    errors = cwd / "stderr.txt"
    with open(errors, "w") as err:
        process = subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.time() + wait
        while not ready.exists() and process.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        if ready.exists():
            signum = signal.Signals[signal_name]
            os.killpg(process.pid, signum) if to_group else os.kill(process.pid, signum)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # a hung run must not outlive its test
            process.wait()
            raise
    stderr = errors.read_text()
    assert ready.exists(), stderr[-4000:]
    return process.returncode, stderr


class Dropout(Callback):
    """Turns on dropout with rate `p` in every dropout layer of the model (the presets have none; ByT5-small has 0.1)."""

    def __init__(self, p: float = 0.1) -> None:
        self.p = p

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for module in pl_module.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = self.p
            if hasattr(module, "dropout") and isinstance(module.dropout, float):  # T5Attention's functional dropout
                module.dropout = self.p


def per_example_grads(fisher: "FisherInformation", batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """[B, *shape] gradients of each pair's own loss, in batch order (what the Fisher squares and sums)."""
    names = [name for name, _ in fisher.retriever.encoder.named_parameters()]
    grads = [fisher.example_grad(batch, i) for i in range(len(batch["index"]))]
    return {name: torch.stack([g[j] for g in grads]) for j, name in enumerate(names)}


def padded(rows: list[list[int]], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Token rows as a [N, width] int32 table padded with 0, and their lengths: the dense reference form."""
    ids = np.zeros((len(rows), width), dtype=np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return ids, np.asarray([len(row) for row in rows], dtype=np.int32)


def byt5_dense(texts: list[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """ByT5's ids written out by hand (UTF-8 bytes + 3, cut to max_len - 1, EOS 1, PAD 0), padded to max_len."""
    return padded([[b + 3 for b in text.encode("utf-8")[: max_len - 1]] + [1] for text in texts], max_len)


def gather_tokens(ids: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a dense table, trimmed to the longest one; row -1 gives an all-padding row (the reference gather)."""
    safe = np.where(rows >= 0, rows, 0)
    width = int(max(lengths[safe].max(initial=1), 1))
    out = ids[safe, :width].copy()
    mask = (np.arange(width)[None, :] < lengths[safe][:, None]).astype(np.int64)
    out[rows < 0] = 0
    mask[rows < 0] = 0
    mask[rows < 0, 0] = 1
    return out.astype(np.int64), mask
