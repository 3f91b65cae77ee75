"""Diagonal Fisher information of a trained retriever, for Elastic Weight Consolidation.

Default (`mode: empirical`): the per-example empirical Fisher
    F_j = (1/N) * sum_n (d loss_n / d theta_j)^2
over the N distinct training pairs, where loss_n is the retriever's MSE loss on pair n's own
candidates (its positive and its negatives), so it does not depend on which other pairs share
a batch. Per-example gradients come from one small autograd pass per pair through the retriever's
length-chunked encoder calls, about what a training pass costs, where vmap over grad pads every pair
to the batch's longest rows (`python -m benchmarks.fisher_cost` compares them).

`mode: leanagent` reproduces LeanAgent's quantity for comparison. LeanAgent's backward goes through
DDP, so each batch's gradient is the mean over ranks of their batch-mean (in-batch) loss gradients;
that gradient is squared and summed over batches on every rank, the sums are added over ranks, and
the total is divided by len(dataset) * world_size:
    F_j = W * sum_b (mean_r g_{r,b,j})^2 / (N * W)
It depends on batch size, world size and batch order (fixed here, so it can be reproduced).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import pytorch_lightning as pl
import torch
import torch.distributed as dist

from leanagent.console import process_rank
from leanagent.errors import LeanAgentError
from leanagent.ewc.fisher_file import save_fisher
from leanagent.faults.watchdog import beat
from leanagent.io import write_target
from leanagent.models.data_contract import TrainOrder
from leanagent.models.loading import load_retriever
from leanagent.models.losses import batch_loss, contrastive_loss, stack_padded

log = logging.getLogger("leanagent")


class FisherInformation(pl.LightningModule):
    """Runs once over the training split (`fit`, one epoch), never updates weights, writes one safetensors file."""

    def __init__(
        self,
        ckpt_path: str = "checkpoints/retrieval/last.ckpt",
        output_path: str = "checkpoints/fisher/fisher.safetensors",
        mode: Literal["empirical", "leanagent"] = "empirical",
        model_name: str = "byt5-tiny",
        max_seq_len: int = 512,
        chunk_size: int | None = None,
    ) -> None:
        """
        Args:
            ckpt_path: the retriever checkpoint whose Fisher is computed.
            output_path: where global rank 0 writes the Fisher (.safetensors).
            mode: `empirical` (per-example, see module doc) or `leanagent` (LeanAgent's batch quantity).
            model_name: must match the checkpoint's; linked to the data module's tokenizer.
            max_seq_len: linked from `data.max_seq_len`.
            chunk_size: no longer used (pairs are taken one at a time); kept so that configs that set it parse.
        """
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        if mode not in ("empirical", "leanagent"):
            raise LeanAgentError(f"model.mode must be 'empirical' or 'leanagent', got {mode!r}")
        self.ckpt_path = ckpt_path
        self.output_path = output_path
        self.mode = mode
        self.chunk_size = chunk_size
        self.retriever = load_retriever(ckpt_path, model_name, what="model.ckpt_path")
        trained_len = self.retriever.hparams.get("max_seq_len")
        # Valid, but weighed on inputs cut elsewhere; every rank builds this module alike, so rank 0 says it.
        if trained_len is not None and trained_len != max_seq_len and process_rank() == "0":
            log.warning("model.ckpt_path %s was trained on data.max_seq_len=%d; this Fisher pass reads %d bytes per "
                        "input (pass --data.max_seq_len=%d to weigh what it trained on)", ckpt_path, trained_len,
                        max_seq_len, trained_len)
        self.retriever.requires_grad_(True)
        self._sum: dict[str, torch.Tensor] = {}
        self._count = 0

    def train_order(self) -> TrainOrder:
        """The per-example Fisher needs each pair on exactly one rank, nothing padded in; LeanAgent's
        quantity depends on batch order, so it keeps the dataset's order (reproducible)."""
        return TrainOrder("single_pass" if self.mode == "empirical" else "in_order")

    def configure_optimizers(self) -> None:
        return None

    def example_grad(self, batch: dict[str, torch.Tensor], i: int) -> list[torch.Tensor]:
        """The gradient of pair i's own loss (its query against its positive and negatives), one per encoder
        parameter, computed as a training step computes a loss: the retriever's length-chunked encoder calls.

        One small autograd pass per pair, not a vmap over the batch: vmap pads every pair to the batch's
        longest rows, and attention grows with the square of the width (`python -m benchmarks.fisher_cost`).
        """
        size = len(batch["index"])
        per = batch["cand_ids"].shape[0] // size
        rows = slice(i * per, (i + 1) * per)
        ids = stack_padded(batch["query_ids"][i : i + 1], batch["cand_ids"][rows])
        mask = stack_padded(batch["query_mask"][i : i + 1], batch["cand_mask"][rows])
        with torch.enable_grad():
            embeddings = self.retriever(ids, mask)
            loss = contrastive_loss(embeddings[:1] @ embeddings[1:].T, batch["labels"][i : i + 1, rows],
                                    batch["cand_valid"][None, rows], self.retriever.loss)
            return list(torch.autograd.grad(loss, [p for _, p in self.retriever.encoder.named_parameters()]))

    def squared_example_grads(self, batch: dict[str, torch.Tensor], weights: torch.Tensor) -> dict[str, torch.Tensor]:
        """sum_i weights[i] * g_i^2 over the batch's pairs, accumulated pair by pair (never [B, *shape] at once)."""
        named = list(self.retriever.encoder.named_parameters())
        out = {name: torch.zeros_like(p, dtype=torch.float32) for name, p in named}
        for i, weight in enumerate(weights.tolist()):
            if weight:
                for (name, _), g in zip(named, self.example_grad(batch, i)):
                    out[name] += weight * g.float() ** 2
        return out

    def batch_grads(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Gradient of the in-batch training loss (LeanAgent's unit), computed as the training step computes
        it (the retriever's length-chunked encoder calls), so that it costs what a training step does."""
        named = list(self.retriever.encoder.named_parameters())
        with torch.enable_grad():
            loss = batch_loss(self.retriever, batch, self.retriever.loss)
            grads = torch.autograd.grad(loss, [p for _, p in named])
        return {name: g for (name, _), g in zip(named, grads)}

    def rank_averaged(self, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What DDP's backward leaves in `.grad`: the mean of every rank's gradient (one all-reduce)."""
        world = self.trainer.world_size
        if not (dist.is_available() and dist.is_initialized() and world > 1):
            return grads
        names = list(grads)
        flat = torch.cat([grads[n].float().reshape(-1) for n in names])
        dist.all_reduce(flat)
        flat /= world
        out, offset = {}, 0
        for n in names:
            out[n] = flat[offset : offset + grads[n].numel()].view_as(grads[n])
            offset += grads[n].numel()
        return out

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        beat("Fisher", batch_idx)
        real = ~batch["padding"] if "padding" in batch else torch.ones(len(batch["index"]), dtype=torch.bool)
        real = real.to(self.device)
        if self.mode == "empirical":
            squared = self.squared_example_grads(batch, real.float())  # padding copies count 0
        else:
            squared = {k: g.float() ** 2 for k, g in self.rank_averaged(self.batch_grads(batch)).items()}
        for name, value in squared.items():
            if name in self._sum:
                self._sum[name] += value
            else:
                self._sum[name] = value.clone()
        self._count += int(real.sum())

    def on_train_epoch_end(self) -> None:
        names = [name for name, _ in self.retriever.encoder.named_parameters()]
        shapes = {name: p.shape for name, p in self.retriever.encoder.named_parameters()}
        flat = torch.cat(
            [self._sum.get(n, torch.zeros(shapes[n], device=self.device)).reshape(-1) for n in names]
            + [torch.tensor([float(self._count)], device=self.device)]
        ).to(torch.float64)
        world = self.trainer.world_size
        if dist.is_available() and dist.is_initialized() and world > 1:
            dist.all_reduce(flat)
        examples = int(flat[-1].item())
        dataset_size = len(self.trainer.train_dataloader.dataset)
        if self.mode == "empirical":
            if examples != dataset_size:
                raise LeanAgentError(
                    f"the Fisher pass saw {examples} of {dataset_size} training pairs: it needs the whole split "
                    "(do not set trainer.limit_train_batches or max_steps for it)"
                )
            divisor = float(examples)
        else:
            divisor = float(dataset_size * world)
        fisher, offset = {}, 0
        for name in names:
            n = shapes[name].numel()
            fisher[f"encoder.{name}"] = (flat[offset : offset + n] / divisor).to(torch.float32).view(shapes[name]).cpu()
            offset += n
        if self.trainer.global_rank == 0:
            metadata: dict[str, Any] = {
                "format": "leanagent-fisher-v1",
                "mode": self.mode,
                "num_examples": examples,
                "world_size": world,
                "source_checkpoint": str(self.ckpt_path),
                "model_name": self.retriever.model_name,
            }
            theta_star = {name: p.detach() for name, p in self.retriever.named_parameters() if name in fisher}
            save_fisher(write_target(self.output_path), fisher, metadata, theta_star=theta_star)
            log.info("wrote %s Fisher over %d examples (world size %d) to %s", self.mode, examples, world, self.output_path)
        self.fisher = fisher
