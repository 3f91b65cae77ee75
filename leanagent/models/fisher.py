"""Diagonal Fisher information of a trained retriever, for Elastic Weight Consolidation.

Default (`mode: empirical`): the per-example empirical Fisher
    F_j = (1/N) * sum_n (d loss_n / d theta_j)^2
over the N distinct training pairs, where loss_n is the retriever's MSE loss on pair n's own
candidates (its positive and its negatives), so it does not depend on which other pairs share
a batch. Per-example gradients come from torch.func (vmap over grad), not a Python loop.

`mode: leanagent` reproduces LeanAgent's quantity for comparison. LeanAgent's backward goes through
DDP, so each batch's gradient is the mean over ranks of their batch-mean (in-batch) loss gradients;
that gradient is squared and summed over batches on every rank, the sums are added over ranks, and
the total is divided by len(dataset) * world_size:
    F_j = W * sum_b (mean_r g_{r,b,j})^2 / (N * W)
It depends on batch size, world size and batch order (fixed here, so it can be reproduced).
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any, Literal

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch.func import functional_call, grad, vmap

from leanagent.errors import LeanAgentError
from leanagent.checkpoints import load_checkpoint
from leanagent.fisher_file import save_fisher
from leanagent.models.retriever import PremiseRetriever, batch_loss, contrastive_loss
from leanagent.watchdog import beat

log = logging.getLogger("leanagent")


def load_retriever(ckpt_path: str | Path, model_name: str | None = None) -> PremiseRetriever:
    """A retriever from a Lightning checkpoint, loaded with weights_only=True (no pickle code runs)."""
    path = Path(ckpt_path)
    checkpoint = load_checkpoint(path, "retriever checkpoint")
    hparams = dict(checkpoint.get("hyper_parameters") or {})
    if "state_dict" not in checkpoint or "model_name" not in hparams:
        raise LeanAgentError(f"{path}: not a PremiseRetriever checkpoint (no state_dict or hyper_parameters)")
    if model_name is not None and hparams["model_name"] != model_name:
        raise LeanAgentError(
            f"{path} was trained with model_name '{hparams['model_name']}', but model.model_name is '{model_name}'"
        )
    known = set(inspect.signature(PremiseRetriever.__init__).parameters) - {"self", "fisher_path", "ewc_lambda", "ewc_form"}
    retriever = PremiseRetriever(**{k: v for k, v in hparams.items() if k in known})
    retriever.on_load_checkpoint(checkpoint)
    retriever.load_state_dict(checkpoint["state_dict"])
    return retriever


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
            chunk_size: examples per vmap chunk, to bound memory (None: the whole batch).
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
        self.retriever = load_retriever(ckpt_path, model_name)
        self.retriever.requires_grad_(True)
        self._sum: dict[str, torch.Tensor] = {}
        self._count = 0

    @property
    def needs_single_pass(self) -> bool:
        """Tells the datamodule: each pair on exactly one rank, nothing padded in (the per-example Fisher)."""
        return self.mode == "empirical"

    needs_fixed_order = True  # LeanAgent's mode depends on batch order: keep it reproducible

    def configure_optimizers(self) -> None:
        return None

    def _params(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        encoder = self.retriever.encoder
        params = {k: v.detach() for k, v in encoder.named_parameters()}
        buffers = {k: v.detach() for k, v in encoder.named_buffers()}
        return params, buffers

    def _encode(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]):
        encoder = self.retriever.encoder
        return lambda ids, mask: functional_call(encoder, (params, buffers), (ids, mask))

    def per_example_grads(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """[B, *shape] gradients of each pair's own loss."""
        params, buffers = self._params()
        size = len(batch["index"])
        per = batch["cand_ids"].shape[0] // size
        cand_ids = batch["cand_ids"].view(size, per, -1)
        cand_mask = batch["cand_mask"].view(size, per, -1)
        valid = batch["cand_valid"].view(size, per)
        rows = torch.arange(size, device=cand_ids.device)
        own_labels = batch["labels"].view(size, size, per)[rows, rows]

        def example_loss(p, query_ids, query_mask, ids, mask, ok, labels):
            encode = self._encode(p, buffers)
            query = encode(query_ids[None], query_mask[None])
            candidates = encode(ids, mask)
            return contrastive_loss(query @ candidates.T, labels[None], ok[None], self.retriever.loss)

        return vmap(grad(example_loss), in_dims=(None, 0, 0, 0, 0, 0, 0), chunk_size=self.chunk_size)(
            params, batch["query_ids"], batch["query_mask"], cand_ids, cand_mask, valid, own_labels
        )

    def batch_grads(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Gradient of the in-batch training loss (LeanAgent's unit)."""
        params, buffers = self._params()
        return grad(lambda p: batch_loss(self._encode(p, buffers), batch, self.retriever.loss))(params)

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
            squared = {
                k: (g.float() ** 2 * real.view(-1, *[1] * (g.dim() - 1))).sum(dim=0)  # padding copies count 0
                for k, g in self.per_example_grads(batch).items()
            }
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
            save_fisher(self.output_path, fisher, metadata, theta_star=theta_star)
            log.info("wrote %s Fisher over %d examples (world size %d) to %s", self.mode, examples, world, self.output_path)
        self.fisher = fisher
