"""The dense premise retriever (ReProver/LeanAgent): a T5 encoder trained contrastively, evaluated over accessible premises."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytorch_lightning as pl
import numpy as np
import torch
import torch.distributed as dist

from leanagent.errors import LeanAgentError
from leanagent.fisher_file import check_state_dict
from leanagent.metrics import METRIC_NAMES, retrieval_metrics
from leanagent.models.encoder import Encoder
from leanagent.watchdog import beat


def contrastive_loss(
    similarity: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, loss: str = "mse", temperature: float = 0.05
) -> torch.Tensor:
    """Loss of cosine similarities [B, C] against 0/1 labels, over real (not padded) candidates.

    `mse` is ReProver's and LeanAgent's: (similarity - label)^2 averaged over valid entries.
    `infonce` is the multi-positive softmax loss: -log(sum over positives / sum over candidates) of
    exp(similarity / temperature), averaged over queries that have a positive. It depends only on
    how candidates rank against each other, so it keeps what an encoder already ranks well.
    """
    weight = valid.to(similarity.dtype).expand_as(similarity)
    if loss == "mse":
        return ((similarity - labels) ** 2 * weight).sum() / weight.sum().clamp(min=1)
    logits = (similarity / temperature).masked_fill(weight == 0, float("-inf"))
    positive_logits = logits.masked_fill(labels * weight == 0, float("-inf"))
    has_positive = (labels * weight).sum(dim=1) > 0
    # Rows without a positive get a zero loss with finite gradients (not 0 * NaN through torch.where).
    positive_logits = torch.where(has_positive[:, None], positive_logits, logits)
    per_query = torch.logsumexp(logits, dim=1) - torch.logsumexp(positive_logits, dim=1)
    per_query = torch.where(has_positive, per_query, torch.zeros_like(per_query))
    return per_query.sum() / has_positive.sum().clamp(min=1)


LOSSES = ("mse", "infonce")


def batch_loss(encode, batch: dict[str, torch.Tensor], loss: str = "mse") -> torch.Tensor:
    """The in-batch loss: every query against every candidate of the batch (its own and the others')."""
    queries = encode(batch["query_ids"], batch["query_mask"])
    candidates = encode(batch["cand_ids"], batch["cand_mask"])
    return contrastive_loss(queries @ candidates.T, batch["labels"], batch["cand_valid"][None, :], loss)


def warmup_cosine(warmup_steps: int, total_steps: int):
    """Linear warmup to the peak LR, then cosine decay to zero at the last optimizer step."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


class PremiseRetriever(pl.LightningModule):
    def __init__(
        self,
        model_name: str = "byt5-tiny",
        lr: float = 1e-4,
        warmup_steps: int = 2000,
        num_retrieved: int = 100,
        max_seq_len: int = 512,
        weight_decay: float = 0.0,
        length_bucket: int = 16,
        loss: str = "mse",
        fisher_path: str | None = None,
        ewc_lambda: float = 0.0,
        ewc_form: str = "paper",
    ) -> None:
        """
        Args:
            model_name: a built-in preset (`byt5-tiny`, `byt5-mini`) or a Hugging Face name/path such as `google/byt5-small`.
            lr: peak learning rate of AdamW.
            warmup_steps: optimizer steps of linear warmup before cosine decay.
            num_retrieved: premises retrieved per tactic state in evaluation and prediction.
            max_seq_len: linked from `data.max_seq_len`; recorded so a checkpoint says how it was trained.
            weight_decay: AdamW weight decay.
            length_bucket: sequences encoded per call, grouped by length, so one long premise
                does not pad a whole batch (attention cost grows with the square of the length).
            loss: `mse` (ReProver/LeanAgent) or `infonce` (see `contrastive_loss`).
            fisher_path: a Fisher file; with `ewc_lambda` > 0 training adds the EWC penalty towards
                the weights that Fisher was computed on (see leanagent/ewc.py).
            ewc_lambda: EWC strength (0 disables it).
            ewc_form: `paper` (lambda/2 * sum F (theta - theta*)^2) or `leanagent` (no 1/2).
        """
        super().__init__()
        # LightningCLI lets a checkpoint's hyperparameters override the command line, so settings that
        # belong to a run rather than to the weights (evaluation size, EWC of this stage) are not saved.
        self.save_hyperparameters(ignore=["num_retrieved", "fisher_path", "ewc_lambda", "ewc_form"])
        if loss not in LOSSES:
            raise LeanAgentError(f"model.loss must be one of {LOSSES}, got {loss!r}")
        if num_retrieved < 1:
            raise LeanAgentError(f"model.num_retrieved must be at least 1, got {num_retrieved}")
        self.model_name = model_name
        self.lr = lr
        self.warmup_steps = warmup_steps
        self.num_retrieved = num_retrieved
        self.weight_decay = weight_decay
        self.length_bucket = length_bucket
        self.loss = loss
        self.encoder = Encoder(model_name)
        self.ewc = None
        if fisher_path and ewc_lambda > 0:
            from leanagent.ewc import load_ewc

            self.ewc = load_ewc(fisher_path, dict(self.encoder_parameters()), ewc_lambda, ewc_form)
        self.corpus_embeddings: torch.Tensor | None = None
        self._embedded_at: tuple[int, str] | None = None

    def encoder_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """Parameters under the names checkpoints and Fisher files use."""
        return ((f"encoder.{name}", p) for name, p in self.encoder.named_parameters())

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Embeddings in input order, computed on length-sorted chunks trimmed to their own longest row."""
        lengths = attention_mask.sum(dim=1)
        order = lengths.argsort()
        parts = []
        for chunk in order.split(self.length_bucket):
            width = int(lengths[chunk].max())
            parts.append(self.encoder(input_ids[chunk, :width], attention_mask[chunk, :width]))
        return torch.cat(parts)[order.argsort()]

    # Training.
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        size = len(batch["index"])
        loss = batch_loss(self, batch, self.loss)
        if self.ewc is not None:
            penalty = self.ewc(dict(self.encoder_parameters()))
            self.log("loss_retrieval_train", loss, on_step=True, on_epoch=True, sync_dist=True, batch_size=size)
            self.log("ewc_penalty_train", penalty, on_step=True, on_epoch=True, sync_dist=True, batch_size=size)
            loss = loss + penalty
        self.log("loss_train", loss, on_step=True, on_epoch=True, prog_bar=True, sync_dist=True, batch_size=size)
        return loss

    def on_train_epoch_start(self) -> None:
        datamodule = self.trainer.datamodule
        if hasattr(datamodule, "set_epoch"):
            datamodule.set_epoch(self.current_epoch)
        self.corpus_embeddings = None

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(self.warmup_steps, total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # Corpus embeddings, shared by validation, test and predict.
    @torch.no_grad()
    def embed_corpus(self) -> torch.Tensor:
        """Each rank embeds every W-th premise; one all_gather assembles the [num_premises, dim] matrix."""
        beat("corpus embedding")  # each forward below counts as progress (leanagent/watchdog.py)
        datamodule = self.trainer.datamodule
        num_premises = len(datamodule.corpus)
        world, rank = self.trainer.world_size, self.trainer.global_rank
        mine = np.arange(rank, num_premises, world)
        by_length = np.argsort(datamodule.corpus_tokens.lengths[mine], kind="stable")  # little padding per batch
        chunks = [
            self(batch["ids"].to(self.device), batch["mask"].to(self.device))
            for batch in datamodule.corpus_dataloader(mine[by_length])
        ]
        local = torch.cat(chunks) if chunks else torch.zeros(0, self._embedding_dim(), device=self.device)
        local = local[torch.from_numpy(np.argsort(by_length)).to(self.device)]
        if world == 1:
            return local
        per_rank = math.ceil(num_premises / world)
        padded = torch.zeros(per_rank, local.shape[1], device=self.device, dtype=local.dtype)
        padded[: len(local)] = local
        gathered = self.all_gather(padded)  # [world, per_rank, dim]
        out = torch.empty(num_premises, local.shape[1], device=self.device, dtype=local.dtype)
        for r in range(world):
            count = len(range(r, num_premises, world))
            out[r::world] = gathered[r, :count]
        return out

    def _embedding_dim(self) -> int:
        return self.encoder.t5.config.d_model

    def _ensure_corpus_embeddings(self) -> None:
        """Embed the corpus once per weight version and corpus file, not once per evaluation call."""
        key = (self.global_step, self.trainer.datamodule.corpus_fingerprint)
        if self.corpus_embeddings is None or self._embedded_at != key:
            self.corpus_embeddings = self.embed_corpus()
            self._embedded_at = key

    @torch.no_grad()
    def retrieve(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Top `num_retrieved` accessible premises per query: one masked top-k for the whole batch.

        A query with fewer accessible premises than `num_retrieved` gets all of them; the rest are -1.
        """
        corpus = self.trainer.datamodule.corpus
        queries = self(batch["query_ids"], batch["query_mask"])
        scores = queries @ self.corpus_embeddings.T
        accessible = corpus.accessible_mask(batch["file_ids"], batch["pos_keys"])
        scores = scores.masked_fill(~accessible, float("-inf"))
        k = min(self.num_retrieved, scores.shape[1])
        top_scores, top_ids = scores.topk(k, dim=1)
        top_ids = torch.where(torch.isfinite(top_scores), top_ids, torch.full_like(top_ids, -1))
        return top_ids, top_scores

    # Evaluation: per-example metrics stored by example index, summed over ranks once per epoch.
    def _start_eval(self, split: str) -> None:
        self._ensure_corpus_embeddings()
        size = len(self.trainer.datamodule.states(split))
        self._eval_values = torch.zeros(size, len(METRIC_NAMES) + 1, device=self.device)
        self._eval_seen = torch.zeros(size, device=self.device)

    def _eval_step(self, batch: dict[str, torch.Tensor]) -> None:
        retrieved, _ = self.retrieve(batch)
        self._eval_values[batch["index"]] = retrieval_metrics(retrieved, batch["positives"])
        self._eval_seen[batch["index"]] = 1.0

    def _end_eval(self, suffix: str) -> dict[str, float]:
        summed = torch.cat([self._eval_values, self._eval_seen[:, None]], dim=1)
        if dist.is_available() and dist.is_initialized() and self.trainer.world_size > 1:
            dist.all_reduce(summed)
        seen = summed[:, -1]
        per_example = summed[:, :-1][seen > 0] / seen[seen > 0, None]  # a duplicate counts once
        with_positives = per_example[:, -1] > 0
        count = int(with_positives.sum())
        means = per_example[with_positives, :-1].mean(dim=0) if count else torch.zeros(len(METRIC_NAMES))
        results = {f"{name}_{suffix}": float(v) for name, v in zip(METRIC_NAMES, means)}
        for name, value in results.items():
            self.log(name, value, prog_bar=name.startswith("Recall@10"), sync_dist=True)
        self.log(f"num_evaluated_{suffix}", float(count), sync_dist=True)
        return results

    def on_validation_epoch_start(self) -> None:
        self._start_eval("val")

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(batch)

    def on_validation_epoch_end(self) -> None:
        self._end_eval("val")

    def on_test_epoch_start(self) -> None:
        self._start_eval("test")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(batch)

    def on_test_epoch_end(self) -> None:
        self._end_eval("test")

    def on_predict_epoch_start(self) -> None:
        self._ensure_corpus_embeddings()

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, torch.Tensor]:
        retrieved, scores = self.retrieve(batch)
        return {"index": batch["index"].cpu(), "retrieved": retrieved.cpu(), "scores": scores.float().cpu()}

    # Checkpoints: refuse one made for another architecture with a clear message.
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get("hyper_parameters", {}).get("model_name")
        if saved is not None and saved != self.model_name:
            raise LeanAgentError(
                f"checkpoint was trained with model_name '{saved}', but model.model_name is '{self.model_name}'"
            )
        check_state_dict(checkpoint.get("state_dict", {}), self.state_dict(), "checkpoint")

