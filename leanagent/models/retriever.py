"""The dense premise retriever (ReProver/LeanAgent): a T5 encoder trained contrastively, evaluated over accessible premises.

The LightningModule wires the parts together: losses.py (training loss), schedule.py (LR plan),
corpus_embedding.py (the searched matrix), ranking_eval.py (metrics), hybrid_weights.py and
fit_checkpoint.py (what checkpoints carry). It reads its data through data_contract.RetrievalData.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.trainer.states import TrainerFn

from leanagent import compat
from leanagent.checkpoint_files import FIT_STATE_KEY, check_optimizer_state, drop_per_fit_callback_state, next_fit_start
from leanagent.errors import LeanAgentError
from leanagent.ewc.fisher_file import check_state_dict
from leanagent.models.batch_seeds import batch_seed, run_seed, seed_global_rngs
from leanagent.models.chunking import length_chunks
from leanagent.models.corpus_embedding import CorpusEmbeddings, embed_corpus
from leanagent.models.data_contract import RetrievalData, TrainOrder
from leanagent.models.encoder import Encoder
from leanagent.models.encoder_negatives import mine_with_start_encoder
from leanagent.models.fit_checkpoint import fit_state_entry, resume_position
from leanagent.models.hybrid_weights import load_hybrid_weights, mode_weight, save_hybrid_weights, weight_for
from leanagent.models.hyperparameters import check_settings
from leanagent.models.locality import CHECKPOINT_KEY as LOCALITY_KEY
from leanagent.models.locality import choose_bias, load_bias, with_bonus
from leanagent.models.losses import batch_loss, share_candidates
from leanagent.models.ranking_eval import RankingEvaluation, check_monitors, evaluation_weights, logged_metrics
from leanagent.models.schedule import adamw_with_schedule, fit_steps, override_restored
from leanagent.retrieval.dense import dense_scores, rescore_head
from leanagent.retrieval.fusion import Fuser, choose_weight

log = logging.getLogger("leanagent")


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
        bm25_distillation: float = 0.0,
        locality: bool = True,
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
                higher cuts calls (`python -m benchmarks.train_speed` measures both).
            loss: `mse` (ReProver/LeanAgent) or `infonce` (see `losses.contrastive_loss`).
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
                (`losses.share_candidates`). Off by default: on the bundled 4-rank job it left the dense
                model weaker than in-batch negatives of its own rank (docs/measurements.md).
            bm25_distillation: weight of a second loss that teaches the encoder BM25's ranking of each
                batch's candidates (`losses.bm25_distillation_loss`): matching identifiers, which carries
                over to repositories it never trained on. 0 disables it.
            locality: choose, at each validation, a score bonus for the premises of the theorem's own
                file (leanagent/models/locality.py), which the dense ranking adds to the cosines. False
                ranks by the encoder's cosines alone (a checkpoint's bonus is kept, not used); not saved
                as a hyperparameter, so it applies to any checkpoint.
        """
        super().__init__()
        # LightningCLI lets a checkpoint's hyperparameters override the command line, so settings that
        # belong to a run rather than to the weights (evaluation size, EWC of this stage) are not saved.
        self.save_hyperparameters(
            ignore=["num_retrieved", "fisher_path", "ewc_lambda", "ewc_form", "retrieval", "init_from", "locality"]
        )
        check_settings(loss=loss, num_retrieved=num_retrieved, lr=lr, weight_decay=weight_decay, warmup_steps=warmup_steps,
                       length_bucket=length_bucket, chunk_cost=chunk_cost, bm25_distillation=bm25_distillation, retrieval=retrieval)
        self.retrieval = retrieval
        # Chosen on validation, one per premise set (`Corpus.premise_set_key`) it was chosen on.
        self.hybrid_weights: dict[str, float] = {}
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
        self.bm25_distillation = bm25_distillation
        self.locality = locality
        self.locality_bias = 0.0  # chosen on validation (locality.py); checkpoints carry it
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
        self._corpus = CorpusEmbeddings()
        self._evaluation: RankingEvaluation | None = None
        self.eval_by_weight: dict[float, list[float]] = {}  # the last evaluation's means by dense weight
        self.eval_per_example: dict[float, torch.Tensor] = {}  # and its [n, metrics] rows (benchmarks/hybrid_weights.py)
        self._fit_start_epoch = 0
        self._fit_start_step = 0
        self._resume_position: tuple[int, int] | None = None
        self._stepped_at_resume: int | None = None  # the loggers' step, restored at the first batch

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
        loss = batch_loss(self, batch, self.loss, share, self.bm25_distillation)
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
        self._rng_seed = run_seed()
        self._warn_away_from_theta_star()

    def _warn_away_from_theta_star(self) -> None:
        """The weights the fit starts from (init_from, --ckpt_path or random), once they are all in place."""
        if self.ewc is None or self.global_rank != 0:  # every rank starts from the same weights; one warning is enough
            return
        moved = self.ewc.differing({name: p.detach().cpu() for name, p in self.encoder_parameters()})
        if moved:
            log.warning(
                "EWC: this fit starts from weights other than the Fisher's theta* (%d of %d tensors differ, e.g. %s); "
                "the penalty pulls towards %s", len(moved), len(self.ewc.names), moved[0], self.ewc.source,
            )

    def on_train_batch_start(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """Seed the global RNGs from (seed, epoch, batch, rank): the same dropout masks after a resume (batch_seeds.py)."""
        seed_global_rngs(batch_seed(getattr(self, "_rng_seed", 0), self.current_epoch, batch_idx, self.global_rank))
        if self._stepped_at_resume is not None:  # the first trained batch after a resume from an epoch's end
            if (moved := compat.batches_that_stepped(self.trainer)) != self._stepped_at_resume:
                log.warning("the loggers' step after the resume was %d, set to the checkpoint's %d", moved, self._stepped_at_resume)
                compat.set_batches_that_stepped(self.trainer, self._stepped_at_resume)
            self._stepped_at_resume = None

    def on_train_epoch_start(self) -> None:
        if self._stepped_at_resume is not None:  # resumed from an epoch's end (compat.close_saved_epoch)
            compat.hold_batches_that_stepped(self.trainer, self._stepped_at_resume)
        # New negatives each epoch come from the training sampler's set_epoch (see EpochShuffledSampler).
        self._corpus.clear()

    def train_order(self) -> TrainOrder:
        """Shuffled each epoch; a fit resumed from a mid-epoch checkpoint first finishes that epoch's batches."""
        return TrainOrder("shuffled", self._resume_position, bm25_scores=self.bm25_distillation > 0)

    def configure_optimizers(self) -> dict[str, Any]:
        return adamw_with_schedule(self.parameters(), self.lr, self.weight_decay, self.warmup_steps,
                                   fit_steps(self.trainer, self._fit_start_epoch, self._fit_start_step), self._fit_start_step)

    def on_train_start(self) -> None:
        """This run's lr and weight decay win over a resumed optimizer's (schedule.override_restored)."""
        scheduler = self.lr_schedulers()
        override_restored(self.optimizers(use_pl_optimizer=False), scheduler, self.lr, self.weight_decay)
        steps = fit_steps(self.trainer, self._fit_start_epoch, self._fit_start_step)
        log.info("rank %d: LR schedule over %d optimizer steps from step %d (warmup %d, peak %g), now at step %d",
                 self.global_rank, steps, self._fit_start_step, self.warmup_steps, self.lr, scheduler.last_epoch)

    def setup(self, stage: str) -> None:
        if self.trainer is not None and stage == "fit":
            check_monitors(self.trainer.callbacks, self.num_retrieved, ewc=self.ewc is not None)
            mine_with_start_encoder(self)  # before a --ckpt_path is restored: the fit's start weights

    # Corpus embeddings, shared by validation, test and predict (corpus_embedding.py).
    @property
    def data(self) -> RetrievalData:
        """The trainer's datamodule, through the interface the retriever reads (data_contract.py)."""
        return self.trainer.datamodule

    @property
    def corpus_embeddings(self) -> torch.Tensor | None:
        return self._corpus.matrix

    def embed_corpus(self) -> torch.Tensor:
        """The [num_premises, dim] matrix of the current weights, each rank embedding its share."""
        return embed_corpus(self, self.data, self.encoder.t5.config.d_model)

    def _ensure_corpus_embeddings(self) -> None:
        """Embed the corpus once per weights and encoder input, not once per evaluation call."""
        self._corpus.ensure(self.encoder, self.data.corpus_fingerprint, self.device, self.embed_corpus)

    # Retrieval: dense, BM25 or hybrid scores over accessible premises, one masked top-k per batch.
    def _premise_set(self) -> str | None:
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        return datamodule.corpus.premise_set_key if datamodule is not None else None

    @property
    def own_file_bonus(self) -> float:
        """What the dense ranking adds to the cosines of the state's own file's premises (locality.py)."""
        return self.locality_bias if self.locality else 0.0

    @property
    def current_hybrid_weight(self) -> float:
        """The weight validation chose for this premise set, else DEFAULT_HYBRID_WEIGHT (BM25; hybrid_weights.py)."""
        return weight_for(self.hybrid_weights, self._premise_set())

    @property
    def hybrid_weight_chosen(self) -> bool:
        """Whether a validation chose hybrid's weight for this premise set (else hybrid is BM25's fallback)."""
        return self._premise_set() in self.hybrid_weights

    def _mode_weight(self, mode: str) -> float:
        return mode_weight(mode, self.hybrid_weights, self._premise_set())

    @torch.no_grad()
    def _fuser(self, batch: dict[str, torch.Tensor], dense: bool = True, sparse: bool = True) -> Fuser:
        """The batch's accessible mask and its dense and/or BM25 scores over all premises."""
        data = self.data
        own_file = data.corpus.own_file_mask(batch["file_ids"], batch["pos_keys"])  # part of accessible; the bonus's premises
        accessible = data.corpus.accessible_mask(batch["file_ids"], batch["pos_keys"], own_file)
        cosines = sparse_scores = rescore = None
        if dense:
            queries = self(batch["query_ids"], batch["query_mask"])
            corpus = self._corpus.for_search(self.device)
            cosines = dense_scores(queries, corpus)
            if corpus.dtype != self.corpus_embeddings.dtype:
                rescore = functools.partial(rescore_head, queries=queries, corpus=self.corpus_embeddings)
            cosines, rescore = with_bonus(cosines, rescore, own_file, self.own_file_bonus)
        if sparse:
            texts = data.states(self._split).states
            sparse_scores = data.bm25_index.scores([texts[i] for i in batch["index"].tolist()]).to(accessible.device)
        return Fuser(cosines, sparse_scores, accessible, rescore)

    @torch.no_grad()
    def retrieve(self, batch: dict[str, torch.Tensor], mode: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Top `num_retrieved` accessible premises per query by `mode` (default `retrieval`): one masked top-k.

        A query with fewer accessible premises than `num_retrieved` gets all of them; the rest are -1.
        Hybrid scores are the fused normalised scores (in [0, 1]), not cosines or BM25 scores.
        Dense scores are cosines; under `bf16-mixed` the search runs in bf16 and its first
        `EXACT_HEAD` candidates are re-scored and re-sorted in float32 (leanagent/retrieval/dense.py).
        """
        weight = self._mode_weight(mode or self.retrieval)
        fuser = self._fuser(batch, dense=weight > 0, sparse=weight < 1)
        return fuser.topk(weight, self.num_retrieved)

    # Evaluation: every example at every weight, reduced over ranks once per epoch (ranking_eval.py).
    def _start_eval(self, split: str) -> None:
        self._ensure_corpus_embeddings()
        if split == "val" and self.locality and not self.trainer.sanity_checking:
            self.locality_bias, counted = choose_bias(self, split)
            if self.global_rank == 0:
                log.info("own-file bonus of the dense ranking: %.2f, chosen on %d validation states", self.locality_bias, counted)
        self._split = split
        weights = evaluation_weights(split, self.current_hybrid_weight)
        self._evaluation = RankingEvaluation(len(self.data.states(split)), weights, self.num_retrieved, self.device)

    def _eval_step(self, batch: dict[str, torch.Tensor]) -> None:
        self._evaluation.add(self._fuser(batch), batch["index"], batch["positives"])

    def _end_eval(self, suffix: str) -> dict[str, float]:
        evaluation = self._evaluation
        per_example = evaluation.finish(self.trainer.world_size)
        self.eval_by_weight = evaluation.means(per_example)
        self.eval_per_example = {w: per_example[:, c].cpu() for c, w in enumerate(evaluation.weights)}
        if suffix == "val" and not self.trainer.sanity_checking:
            self.hybrid_weights[self._premise_set()] = choose_weight(self.eval_per_example)
        results = logged_metrics(suffix, evaluation.names, self.eval_by_weight, self._mode_weight, self.current_hybrid_weight)
        for name, value in results.items():
            self.log(name, value, prog_bar=name == f"Recall@10_{suffix}", sync_dist=True)
        self.log(f"num_evaluated_{suffix}", float(len(per_example)), sync_dist=True)
        self.log(f"locality_bias_{suffix}", self.own_file_bonus, sync_dist=True)
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

    # Checkpoints: the fit's plan and the hybrid weights go in; one made for another architecture is refused.
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        save_hybrid_weights(checkpoint, self.hybrid_weights)
        checkpoint[LOCALITY_KEY] = self.locality_bias
        if self.trainer.state.fn == TrainerFn.FITTING:
            checkpoint[FIT_STATE_KEY] = fit_state_entry(self.trainer, self._fit_start_epoch, self._fit_start_step)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._fit_start_epoch, self._fit_start_step = next_fit_start(checkpoint)
        # Runs before Lightning restores the callbacks from the same dict: a new fit starts their per-fit state afresh.
        if self._trainer is not None and self.trainer.state.fn == TrainerFn.FITTING:
            check_optimizer_state(checkpoint, [p.shape for p in self.parameters()], getattr(self.trainer, "ckpt_path", None))
            self._stepped_at_resume = compat.close_saved_epoch(checkpoint)  # before Lightning restores its loops
            cleared = drop_per_fit_callback_state(checkpoint)
            if cleared and self.trainer.is_global_zero:
                log.info("a new fit from a finished one: %s start afresh (not the earlier fit's best score, "
                         "wait count and patience)", ", ".join(k.split("{")[0] for k in cleared))
        # Read by the data module (train_order) when it builds the training loader, before Lightning restores its loops.
        self._resume_position = resume_position(checkpoint, self._trainer)
        restored = getattr(self._trainer, "ckpt_path", None) if self._trainer is not None else None
        source = f"--ckpt_path {restored}" if restored else "checkpoint"
        saved = checkpoint.get("hyper_parameters", {}).get("model_name")
        if saved is not None and saved != self.model_name:
            raise LeanAgentError(
                f"{source} was trained with model_name '{saved}', but model.model_name is '{self.model_name}'"
            )
        check_state_dict(checkpoint.get("state_dict", {}), self.state_dict(), source)
        self.hybrid_weights = load_hybrid_weights(checkpoint)
        self.locality_bias = load_bias(checkpoint, source)
