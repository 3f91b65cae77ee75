"""The dense premise retriever (ReProver/LeanAgent): a T5 encoder trained contrastively, evaluated over accessible premises."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import random
from collections.abc import Iterator
from typing import Any

import pytorch_lightning as pl
import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from pytorch_lightning.trainer.states import TrainerFn

from leanagent.checkpoint_files import FIT_STATE_KEY, FitState, drop_per_fit_callback_state, next_fit_start
from leanagent.errors import LeanAgentError
from leanagent.ewc.fisher_file import check_state_dict
from leanagent.retrieval.metrics import metric_names, recall_ks, retrieval_metrics
from leanagent.models.chunking import length_chunks
from leanagent.models.encoder import Encoder
from leanagent.retrieval.bm25 import BM25Index
from leanagent.retrieval.dense import SearchCorpus, dense_scores, rescore_head, search_dtype
from leanagent.retrieval.fusion import (
    DEFAULT_HYBRID_WEIGHT,
    HYBRID_GRID,
    MODE_WEIGHTS,
    RETRIEVAL_MODES,
    Fuser,
    BASELINE_MODES,
    choose_weight,
)
from leanagent.faults.watchdog import beat

log = logging.getLogger("leanagent")


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


def stack_padded(*tables: torch.Tensor) -> torch.Tensor:
    """Rows of 2D tables one after the other, zero-padded on the right to the widest."""
    width = max(t.shape[1] for t in tables)
    return torch.cat([F.pad(t, (0, width - t.shape[1])) for t in tables])


def batch_loss(encode, batch: dict[str, torch.Tensor], loss: str = "mse", share=None) -> torch.Tensor:
    """The in-batch loss: every query against every candidate of the batch (its own and the others').

    `share`, if given, widens the candidates beyond this batch (`share_candidates`: every rank's).
    """
    # One call for both, so that queries and candidates of similar length share encoder chunks.
    ids = stack_padded(batch["query_ids"], batch["cand_ids"])  # 0 is ByT5's padding id
    mask = stack_padded(batch["query_mask"], batch["cand_mask"])
    embeddings = encode(ids, mask)
    num_queries = len(batch["query_ids"])
    queries, candidates = embeddings[:num_queries], embeddings[num_queries:]
    labels, valid = batch["labels"], batch["cand_valid"]
    if share is not None:
        candidates, premises, valid = share(candidates, batch["cand_premises"], valid)
        labels = candidate_labels(batch["query_positives"], premises)
    return contrastive_loss(queries @ candidates.T, labels, valid[None, :], loss)


def candidate_labels(query_positives: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """[B, C] 1.0 where candidate premise j is any positive of query i (-1 pads both sides)."""
    hit = (candidates[None, :, None] == query_positives[:, None, :]).any(-1) & (candidates[None, :] >= 0)
    return hit.to(torch.float32)


def share_candidates(
    candidates: torch.Tensor, premises: torch.Tensor, valid: torch.Tensor, gather, rank: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every rank's candidates, for in-batch negatives across the whole global batch.

    `gather` is an all_gather that stacks a tensor of every rank ([world, ...]); other ranks' embeddings
    come without gradient (each rank back-propagates through its own candidates, and DDP averages).
    Ranks may hold batches of different sizes (the last one), so rows are padded to the largest.
    """
    sizes = gather(torch.tensor([len(premises)], device=candidates.device)).flatten()
    width = int(sizes.max())
    pad = width - len(premises)
    local = F.pad(candidates, (0, 0, 0, pad))
    with torch.no_grad():
        everyone = gather(local.detach())
    all_embeddings = torch.cat([everyone[:rank], local[None], everyone[rank + 1 :]]).flatten(0, 1)
    all_premises = gather(F.pad(premises, (0, pad), value=-1)).flatten()
    all_valid = gather(F.pad(valid.to(torch.int32), (0, pad))).flatten() > 0  # gloo gathers no bool
    return all_embeddings, all_premises, all_valid


def warmup_cosine(warmup_steps: int, total_steps: int, start_step: int = 0):
    """LeanAgent's schedule (transformers' `get_cosine_schedule_with_warmup`) over one fit.

    The fit's optimizer steps are `start_step .. start_step + total_steps - 1`: linear warmup from 0
    over `warmup_steps`, then cosine decay that reaches zero at `start_step + total_steps`.
    """

    def factor(step: int) -> float:
        s = max(0, step - start_step)
        if s < warmup_steps:
            return s / max(1, warmup_steps)
        progress = (s - warmup_steps) / max(1, total_steps - warmup_steps)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))

    return factor


def batch_seed(seed: int, epoch: int, batch_idx: int, rank: int) -> int:
    """A 63-bit seed that is a function of (seed, epoch, batch, rank) alone (numpy's SeedSequence mixing)."""
    state = np.random.SeedSequence([seed % 2**63, epoch, batch_idx, rank]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 ^ int(state[1])


class PremiseRetriever(pl.LightningModule):
    def __init__(
        self,
        model_name: str = "byt5-tiny",
        lr: float = 1e-4,
        warmup_steps: int = 2000,
        num_retrieved: int = 100,
        max_seq_len: int = 512,
        weight_decay: float = 0.0,
        length_bucket: int = 64,
        chunk_cost: float = 512.0,
        loss: str = "mse",
        fisher_path: str | None = None,
        ewc_lambda: float = 0.0,
        ewc_form: str = "paper",
        retrieval: str = "hybrid",
        init_from: str | None = None,
        cross_rank_negatives: bool = False,
    ) -> None:
        """
        Args:
            model_name: a built-in preset (`byt5-tiny`, `byt5-mini`) or a Hugging Face name/path such as `google/byt5-small`.
            lr: peak learning rate of AdamW.
            warmup_steps: optimizer steps of linear warmup before cosine decay.
            num_retrieved: premises retrieved per tactic state in evaluation and prediction.
            max_seq_len: linked from `data.max_seq_len`; recorded so a checkpoint says how it was trained.
            weight_decay: AdamW weight decay.
            length_bucket: the most sequences encoded per call. Sequences are sorted by length and cut
                into calls that minimise padding plus `chunk_cost` per call (leanagent/models/chunking.py),
                so one long premise does not pad a whole batch (attention grows with the square of the length).
            chunk_cost: the fixed cost of one more encoder call, in padded tokens; lower cuts padding,
                higher cuts calls (512: 1.19x padded tokens on mathlib-order, benchmarks/train_speed.py).
            loss: `mse` (ReProver/LeanAgent) or `infonce` (see `contrastive_loss`).
            fisher_path: a Fisher file; with `ewc_lambda` > 0 training adds the EWC penalty towards
                the weights that Fisher was computed on (see leanagent/ewc/penalty.py).
            ewc_lambda: EWC strength (0 disables it).
            ewc_form: `paper` (lambda/2 * sum F (theta - theta*)^2) or `leanagent` (no 1/2).
            retrieval: the ranking predict writes: `dense` (the encoder), `bm25`
                (leanagent/retrieval/bm25.py) or `hybrid` (their normalised scores, weighted by the
                weight chosen on the validation split; leanagent/retrieval/fusion.py). Validate and
                test always report the dense ranking under the plain names (`Recall@10_val`, what
                checkpoints follow) and the other two beside it (`Recall@10_val/bm25`, `/hybrid`).
            init_from: encoder weights to start from instead of a random initialisation: a shipped
                retriever by name (`leanagent-base`, leanagent/pretrained/), a `.safetensors` weights
                file or a `.ckpt`. A `--ckpt_path` checkpoint's weights replace them when a fit resumes.
            cross_rank_negatives: with `infonce` under DDP, every rank's candidates as in-batch negatives
                (`share_candidates`). Off by default: on the bundled 4-rank job it left the dense model
                weaker (val Recall@10 60.4 against 72.5 without it; README, "Measured").
        """
        super().__init__()
        # LightningCLI lets a checkpoint's hyperparameters override the command line, so settings that
        # belong to a run rather than to the weights (evaluation size, EWC of this stage) are not saved.
        self.save_hyperparameters(
            ignore=["num_retrieved", "fisher_path", "ewc_lambda", "ewc_form", "retrieval", "init_from"]
        )
        if loss not in LOSSES:
            raise LeanAgentError(f"model.loss must be one of {LOSSES}, got {loss!r}")
        if num_retrieved < 1:
            raise LeanAgentError(f"model.num_retrieved must be at least 1, got {num_retrieved}")
        for name, value, low in (("lr", lr, 0.0), ("weight_decay", weight_decay, 0.0), ("warmup_steps", warmup_steps, 0)):
            if not (value >= low and math.isfinite(value)) or (name == "lr" and value == 0):
                raise LeanAgentError(f"model.{name} must be {'positive' if name == 'lr' else 'non-negative'}, got {value}")
        if length_bucket < 1:
            raise LeanAgentError(f"model.length_bucket must be at least 1, got {length_bucket}")
        if not (chunk_cost >= 0 and math.isfinite(chunk_cost)):
            raise LeanAgentError(f"model.chunk_cost must be a non-negative number, got {chunk_cost}")
        if retrieval not in RETRIEVAL_MODES:
            raise LeanAgentError(f"model.retrieval must be one of {RETRIEVAL_MODES}, got {retrieval!r}")
        self.retrieval = retrieval
        # Chosen on validation, one per premise set (`Corpus.premise_set_key`) it was chosen on.
        self.hybrid_weights: dict[str, float] = {}
        self._bm25: tuple[str, BM25Index] | None = None
        self._split = "val"
        self.model_name = model_name
        self.lr = lr
        self.warmup_steps = warmup_steps
        self.num_retrieved = num_retrieved
        self.weight_decay = weight_decay
        self.length_bucket = length_bucket
        self.chunk_cost = chunk_cost
        self.loss = loss
        self.encoder = Encoder(model_name)
        self.init_from = init_from
        self.cross_rank_negatives = cross_rank_negatives
        if init_from is not None:
            from leanagent.pretrained import load_encoder

            expected = dict(self.encoder_parameters())
            aliases = {f"encoder.{name}" for name in self.encoder.state_dict()}
            tensors = load_encoder(init_from, model_name, expected, aliases)
            with torch.no_grad():
                for name, parameter in expected.items():
                    parameter.copy_(tensors[name])
        # A plain object, not a submodule: F and theta* must not be DDP buffers broadcast every step.
        from leanagent.ewc.penalty import build_ewc

        self.ewc = build_ewc(fisher_path, ewc_lambda, ewc_form, dict(self.encoder_parameters()))
        self.corpus_embeddings: torch.Tensor | None = None
        self._embedded_at: tuple | None = None
        self._search_corpus = SearchCorpus()
        self._fit_start_epoch = 0
        self._fit_start_step = 0
        self.resume_position: tuple[int, int] | None = None

    def encoder_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """Parameters under the names checkpoints and Fisher files use."""
        return ((f"encoder.{name}", p) for name, p in self.encoder.named_parameters())

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Embeddings in input order, computed on length-sorted chunks (see `length_chunks`) trimmed to their longest row."""
        lengths = attention_mask.sum(dim=1)
        order = lengths.argsort()
        sorted_lengths = lengths[order].cpu().numpy()
        parts = []
        for start, stop in length_chunks(sorted_lengths, self.length_bucket, self.chunk_cost):
            chunk, width = order[start:stop], int(sorted_lengths[stop - 1])
            parts.append(self.encoder(input_ids[chunk, :width], attention_mask[chunk, :width]))
        return torch.cat(parts)[order.argsort()]

    # Training.
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        size = len(batch["index"])
        share = None
        if (self.cross_rank_negatives and self.loss == "infonce" and self.trainer.world_size > 1
                and dist.is_available() and dist.is_initialized()):
            share = functools.partial(share_candidates, gather=self.all_gather, rank=self.global_rank)
        loss = batch_loss(self, batch, self.loss, share)
        if not torch.isfinite(loss):
            raise LeanAgentError(
                f"the training loss is {loss.item()} at global step {self.global_step} (epoch {self.current_epoch}, "
                f"batch {batch_idx}, rank {self.global_rank}): stopping before any checkpoint takes these weights; "
                "lower model.lr or check the data"
            )
        if self.ewc is not None:
            penalty = self.ewc.to(self.device)(dict(self.encoder_parameters()))
            self._log_train("loss_retrieval_train", loss, size)
            self._log_train("ewc_penalty_train", penalty, size)
            loss = loss + penalty
        self._log_train("loss_train", loss, size, prog_bar=True)
        return loss

    def _log_train(self, name: str, value: torch.Tensor, size: int, prog_bar: bool = False) -> None:
        """Per step, rank 0's own value (no collective in the step); per epoch, the mean over all ranks,
        synchronised once. Logged as `<name>_step` and `<name>_epoch`, as Lightning names them."""
        self.log(f"{name}_step", value, on_step=True, on_epoch=False, prog_bar=prog_bar, batch_size=size)
        self.log(f"{name}_epoch", value, on_step=False, on_epoch=True, sync_dist=True, batch_size=size)

    def on_fit_start(self) -> None:
        # The run's seed (seed_everything's, the same when the same command resumes), for per-batch RNG seeds.
        self._rng_seed = int(os.environ.get("PL_GLOBAL_SEED", torch.initial_seed()))

    def on_train_batch_start(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """Seed the global RNGs from (seed, epoch, batch, rank) before every training batch.

        Dropout (ByT5-small has 0.1) draws from the global torch RNG, which Lightning does not checkpoint,
        and which iterator creation and validation also draw from: a resumed fit would draw other masks.
        Seeded per batch, the masks of batch b of epoch e on rank r are the same in an uninterrupted and a
        resumed fit, and no RNG state needs saving. Negatives and the training order are seeded already.
        """
        seed = batch_seed(getattr(self, "_rng_seed", 0), self.current_epoch, batch_idx, self.global_rank)
        torch.manual_seed(seed)  # CPU and every CUDA device
        random.seed(seed)
        np.random.seed(seed % 2**32)

    def on_train_epoch_start(self) -> None:
        # New negatives each epoch come from the training sampler's set_epoch (see EpochShuffledSampler).
        self.corpus_embeddings = None
        self._search_corpus.clear()

    def fit_steps(self) -> int:
        """Optimizer steps of the fit being run: from its first epoch to `max_epochs` (or `max_steps`)."""
        trainer = self.trainer
        trainer.estimated_stepping_batches  # sets up the train dataloader, so num_training_batches is known
        per_epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
        steps = math.inf
        if trainer.max_epochs is not None and trainer.max_epochs >= 0:
            steps = per_epoch * (trainer.max_epochs - self._fit_start_epoch)
        if trainer.max_steps is not None and trainer.max_steps >= 0:
            steps = min(steps, trainer.max_steps - self._fit_start_step)
        if not math.isfinite(steps):
            raise LeanAgentError("the fit has no end (trainer.max_epochs and max_steps unset): the LR schedule needs one")
        return max(1, int(steps))

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        schedule = warmup_cosine(self.warmup_steps, self.fit_steps(), self._fit_start_step)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule, last_epoch=-1)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_train_start(self) -> None:
        """After a resume, the restored optimizer and scheduler carry the checkpoint's lr and weight decay:
        the values this run was given win, and the LR follows this fit's schedule from its current step."""
        optimizer = self.optimizers(use_pl_optimizer=False)
        scheduler = self.lr_schedulers()
        factor = scheduler.lr_lambdas[0](scheduler.last_epoch)
        for group in optimizer.param_groups:
            group["initial_lr"] = self.lr
            group["lr"] = self.lr * factor
            group["weight_decay"] = self.weight_decay
        scheduler.base_lrs = [self.lr] * len(optimizer.param_groups)
        scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
        log.info(
            "rank %d: LR schedule over %d optimizer steps from step %d (warmup %d, peak %g), now at step %d",
            self.global_rank, self.fit_steps(), self._fit_start_step, self.warmup_steps, self.lr, scheduler.last_epoch,
        )

    def setup(self, stage: str) -> None:
        """Refuse a monitored Recall@k that `num_retrieved` cannot measure, before any training."""
        measured = {f"Recall@{k}" for k in recall_ks(self.num_retrieved)}
        for callback in self.trainer.callbacks if self.trainer is not None and stage == "fit" else []:
            monitor = getattr(callback, "monitor", None)
            if isinstance(monitor, str) and monitor.startswith("Recall@") and monitor.split("_")[0] not in measured:
                raise LeanAgentError(
                    f"{type(callback).__name__} monitors {monitor}, but model.num_retrieved is {self.num_retrieved}, "
                    f"so only {', '.join(sorted(measured))} are measured: raise num_retrieved or change the monitor"
                )

    # Corpus embeddings, shared by validation, test and predict.
    @torch.no_grad()
    def embed_corpus(self) -> torch.Tensor:
        """Each rank embeds every W-th premise; one all_gather assembles the [num_premises, dim] matrix."""
        beat("corpus embedding")  # each forward below counts as progress (leanagent/faults/)
        datamodule = self.trainer.datamodule
        num_premises = len(datamodule.corpus)
        world, rank = self.trainer.world_size, self.trainer.global_rank
        mine = np.arange(rank, num_premises, world)
        by_length = np.argsort(datamodule.corpus_tokens.lengths[mine], kind="stable")  # little padding per batch
        # Epoch-start hooks run outside autocast: enter the trainer's precision (bf16 under bf16-mixed), the
        # costliest part of an evaluation; the search re-scores its head in float32 (leanagent/retrieval/dense.py).
        plugin = getattr(self.trainer, "precision_plugin", None)
        with plugin.forward_context() if plugin is not None else contextlib.nullcontext():
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
        """Embed the corpus once per weights and encoder input, not once per evaluation call.

        Every in-place change of a parameter (optimizer step, load_state_dict) bumps its `_version`,
        so the key changes whenever the weights may have, whoever changed them.
        """
        weights = tuple((p.data_ptr(), p._version) for p in self.encoder.parameters())
        key = (weights, self.trainer.datamodule.corpus_fingerprint, str(self.device))
        if self.corpus_embeddings is None or self._embedded_at != key:
            self._search_corpus.clear()
            self.corpus_embeddings = self.embed_corpus()
            self._embedded_at = key

    def search_embeddings(self) -> torch.Tensor:
        """The corpus embeddings in the dtype this step's matmul runs in (bf16 under `bf16-mixed`).

        Cast on the first batch of an evaluation (hooks outside the steps run without autocast) and
        kept, so no batch casts the [num_premises, dim] matrix again.
        """
        return self._search_corpus.get(self.corpus_embeddings, search_dtype(self.device))

    # Retrieval: dense, BM25 or hybrid scores over accessible premises, one masked top-k per batch.
    def _premise_set(self) -> str | None:
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        return datamodule.corpus.premise_set_key if datamodule is not None else None

    @property
    def current_hybrid_weight(self) -> float:
        """The weight validation chose for this premise set, else DEFAULT_HYBRID_WEIGHT (BM25).

        A weight fitted on one dataset says nothing about how far to trust the encoder on another,
        so on other premises hybrid is BM25 until `validate` or `fit` chooses a weight there.
        """
        return self.hybrid_weights.get(self._premise_set(), DEFAULT_HYBRID_WEIGHT)

    def bm25_index(self) -> BM25Index:
        """Built once per process and corpus content (a few seconds at 40k premises), kept in memory."""
        datamodule = self.trainer.datamodule
        key = datamodule.corpus_fingerprint
        if self._bm25 is None or self._bm25[0] != key:
            index = getattr(datamodule, "bm25_index", None)
            self._bm25 = (key, index if isinstance(index, BM25Index) else BM25Index(datamodule.corpus))
        return self._bm25[1]

    @torch.no_grad()
    def _fuser(self, batch: dict[str, torch.Tensor], dense: bool = True, sparse: bool = True) -> Fuser:
        """The batch's accessible mask and its dense and/or BM25 scores over all premises."""
        datamodule = self.trainer.datamodule
        accessible = datamodule.corpus.accessible_mask(batch["file_ids"], batch["pos_keys"])
        cosines = sparse_scores = rescore = None
        if dense:
            queries = self(batch["query_ids"], batch["query_mask"])
            corpus = self.search_embeddings()
            cosines = dense_scores(queries, corpus)
            if corpus.dtype != self.corpus_embeddings.dtype:
                rescore = functools.partial(rescore_head, queries=queries, corpus=self.corpus_embeddings)
        if sparse:
            texts = datamodule.states(self._split).states
            sparse_scores = self.bm25_index().scores([texts[i] for i in batch["index"].tolist()]).to(accessible.device)
        return Fuser(cosines, sparse_scores, accessible, rescore)

    def _mode_weight(self, mode: str) -> float:
        return MODE_WEIGHTS.get(mode, self.current_hybrid_weight)

    @torch.no_grad()
    def retrieve(self, batch: dict[str, torch.Tensor], mode: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Top `num_retrieved` accessible premises per query by `mode` (default `retrieval`): one masked top-k.

        A query with fewer accessible premises than `num_retrieved` gets all of them; the rest are -1.
        Hybrid scores are the fused normalised scores (in [0, 1]), not cosines or BM25 scores.
        Dense scores are cosines; under `bf16-mixed` the search runs in bf16 and its first
        `EXACT_HEAD` candidates are re-scored and re-sorted in float32 (leanagent/retrieval/dense.py).
        """
        mode = mode or self.retrieval
        weight = self._mode_weight(mode)
        fuser = self._fuser(batch, dense=weight > 0, sparse=weight < 1)
        return fuser.topk(weight, self.num_retrieved)

    # Evaluation: per-example metrics stored by example index, summed over ranks once per epoch.
    # Columns are fusion weights: on val the whole HYBRID_GRID (1 = dense, 0 = BM25), on test
    # dense, BM25 and the stored hybrid weight; every column of every example is all-reduced at once.
    def _start_eval(self, split: str) -> None:
        self._ensure_corpus_embeddings()
        self._split = split
        current = self.current_hybrid_weight
        self._eval_weights = sorted({*HYBRID_GRID, current}) if split == "val" else [1.0, 0.0, current]
        size = len(self.trainer.datamodule.states(split))
        names = metric_names(self.num_retrieved)
        self._eval_values = torch.zeros(size, len(self._eval_weights), len(names) + 1, device=self.device)
        self._eval_seen = torch.zeros(size, device=self.device)

    def _eval_step(self, batch: dict[str, torch.Tensor]) -> None:
        fuser = self._fuser(batch)
        ks = recall_ks(self.num_retrieved)
        for column, weight in enumerate(self._eval_weights):
            retrieved, _ = fuser.topk(weight, self.num_retrieved)
            self._eval_values[batch["index"], column] = retrieval_metrics(retrieved, batch["positives"], ks).to(self.device)
        self._eval_seen[batch["index"]] = 1.0

    def _end_eval(self, suffix: str) -> dict[str, float]:
        size, columns, width = self._eval_values.shape
        summed = torch.cat([self._eval_values.reshape(size, -1), self._eval_seen[:, None]], dim=1)
        if dist.is_available() and dist.is_initialized() and self.trainer.world_size > 1:
            dist.all_reduce(summed)
        seen = summed[:, -1]
        per_example = (summed[:, :-1][seen > 0] / seen[seen > 0, None]).reshape(-1, columns, width)  # a duplicate counts once
        with_positives = per_example[:, 0, -1] > 0
        count = int(with_positives.sum())
        names = metric_names(self.num_retrieved)
        means = per_example[with_positives, :, :-1].mean(dim=0) if count else torch.zeros(columns, len(names))
        by_weight = {w: means[c] for c, w in enumerate(self._eval_weights)}
        self.eval_by_weight = {w: [float(v) for v in values] for w, values in by_weight.items()}  # for benchmarks
        if suffix == "val" and not self.trainer.sanity_checking:
            examples = per_example[with_positives, :, :-1]
            weight = choose_weight({w: examples[:, c] for c, w in enumerate(self._eval_weights)})
            self.hybrid_weights[self._premise_set()] = weight
        # The plain names are the learner's own ranking (dense), whatever `retrieval` makes predict write:
        # they are what checkpoints and early stopping follow, and no fallback can hold them up.
        results = {f"{name}_{suffix}": float(v) for name, v in zip(names, by_weight[MODE_WEIGHTS["dense"]])}
        for mode in BASELINE_MODES:
            values = by_weight[self._mode_weight(mode)]
            results.update({f"{name}_{suffix}/{mode}": float(v) for name, v in zip(names, values)})
        results[f"hybrid_weight_{suffix}"] = self.current_hybrid_weight
        for name, value in results.items():
            self.log(name, value, prog_bar=name == f"Recall@10_{suffix}", sync_dist=True)
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
        self._split = "predict"
        if self._mode_weight(self.retrieval) > 0:  # bm25, or hybrid at weight 0 (BM25), needs no embeddings
            self._ensure_corpus_embeddings()

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, torch.Tensor]:
        retrieved, scores = self.retrieve(batch)
        return {"index": batch["index"].cpu(), "retrieved": retrieved.cpu(), "scores": scores.float().cpu()}

    # Checkpoints: the fit's plan goes in; one made for another architecture is refused.
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._save_hybrid_weight(checkpoint)
        trainer = self.trainer
        if trainer.state.fn != TrainerFn.FITTING:
            return
        epoch_done = bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)
        last_epoch = trainer.max_epochs is not None and 0 <= trainer.max_epochs <= trainer.current_epoch + 1
        state = FitState(
            start_epoch=self._fit_start_epoch,
            start_step=self._fit_start_step,
            max_epochs=int(trainer.max_epochs if trainer.max_epochs is not None else -1),
            finished=epoch_done and (last_epoch or trainer.should_stop),
        )
        checkpoint[FIT_STATE_KEY] = {
            **state.as_dict(),
            # Where in the epoch this checkpoint was taken (a preemption saves mid-epoch), for an exact resume.
            "epoch": trainer.current_epoch,
            "batches_done": int(trainer.fit_loop.epoch_loop.batch_progress.current.processed),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._fit_start_epoch, self._fit_start_step = next_fit_start(checkpoint)
        # Runs before Lightning restores the callbacks from the same dict: a new fit starts their per-fit state afresh.
        if self._trainer is not None and self.trainer.state.fn == TrainerFn.FITTING:
            cleared = drop_per_fit_callback_state(checkpoint)
            if cleared and self.trainer.is_global_zero:
                log.info("a new fit from a finished one: %s start afresh (not the earlier fit's best score, "
                         "wait count and patience)", ", ".join(k.split("{")[0] for k in cleared))
        if self.ewc is not None:
            state = checkpoint.get("state_dict", {})
            moved = [n for n in self.ewc.names if n in state and not torch.equal(state[n].float(), self.ewc.theta_star[n].cpu())]
            if moved and self.global_rank == 0:  # every rank loads the checkpoint; one warning is enough
                log.warning(
                    "EWC: this fit starts from weights other than the Fisher's theta* (%d of %d tensors differ, e.g. %s); "
                    "the penalty pulls towards %s", len(moved), len(self.ewc.names), moved[0], self.ewc.source,
                )
        saved = checkpoint.get(FIT_STATE_KEY) or {}
        # Read by the data module when it builds the training loader (before Lightning restores its loops).
        self.resume_position = (int(saved["epoch"]), int(saved["batches_done"])) if "batches_done" in saved else None
        saved = checkpoint.get("hyper_parameters", {}).get("model_name")
        if saved is not None and saved != self.model_name:
            raise LeanAgentError(
                f"checkpoint was trained with model_name '{saved}', but model.model_name is '{self.model_name}'"
            )
        check_state_dict(checkpoint.get("state_dict", {}), self.state_dict(), "checkpoint")
        self._load_hybrid_weight(checkpoint)

    # The hybrid weights chosen on validation travel in the checkpoint, keyed by premise set.
    def _save_hybrid_weight(self, checkpoint: dict[str, Any]) -> None:
        if self.hybrid_weights:
            checkpoint["hybrid_weights"] = dict(self.hybrid_weights)

    def _load_hybrid_weight(self, checkpoint: dict[str, Any]) -> None:
        """Valid entries only; older checkpoints (one weight keyed by corpus file bytes) carry none that count."""
        stored = checkpoint.get("hybrid_weights")
        stored = stored if isinstance(stored, dict) else {}
        self.hybrid_weights = {
            key: float(w) for key, w in stored.items()
            if isinstance(key, str) and isinstance(w, (int, float)) and 0.0 <= w <= 1.0
        }
