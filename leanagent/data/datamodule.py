"""The LightningDataModule for premise retrieval on a LeanDojo Benchmark 4 dataset.

Argument names follow ReProver's `RetrievalDataModule` so its configs carry over. Loading is
lazy: `setup` does nothing heavy, so the data-loading barrier callback (whose `setup` hook
runs after the datamodule's) really runs before any file is read.
"""

from __future__ import annotations

import hashlib
import logging
import signal
from collections.abc import Callable
from functools import partial
from typing import Any, Literal

import pytorch_lightning as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from leanagent.corpus.corpus import Corpus
from leanagent.data.datasets import EvalStates, TrainingPairs
from leanagent.data.hard_negatives import shared_hard_negatives
from leanagent.data.negatives import NegativeSampler
from leanagent.data.samplers import DEFAULT_SEED, EpochShuffledSampler, ResumableLoader, UnpaddedDistributedSampler
from leanagent.corpus.tactics import (TacticStates, load_tactic_states, require_positives, require_training_examples,
                                     warn_shared_theorems, warn_unresolved)
from leanagent.data.token_store import TokenTable, corpus_code_version, source_key, tokenize
from leanagent.models.data_contract import OrdersTraining, Ranker, RetrievalData, TrainOrder
from leanagent.models.tokenizer import load_tokenizer
from leanagent.errors import LeanAgentError, refuse_repeats
from leanagent.io import read_bytes, require_file, require_folder
from leanagent.retrieval.bm25 import BM25Index

log = logging.getLogger("leanagent")

SPLITS = ("train", "val", "test")


def ignore_stop_signals(worker_id: int) -> None:
    """DataLoader workers leave SIGINT and SIGTERM to their rank.

    A terminal's Ctrl-C (or a scheduler's SIGTERM) reaches the whole process group, workers included; a
    worker that died of it would fail the rank's next batch before the rank could save its checkpoint
    (callbacks/preemption.py). A worker still ends with its rank (PyTorch's workers watch their parent).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class RetrievalDataModule(pl.LightningDataModule, RetrievalData):
    def __init__(
        self,
        data_path: str = "data/batteries/random",
        corpus_path: str = "data/batteries/corpus.jsonl",
        num_negatives: int = 3,
        num_in_file_negatives: int = 1,
        num_hard_negatives: int = 2,
        hard_negative_pool: int = 32,
        hard_negatives_by: Literal["bm25", "encoder"] = "bm25",
        batch_size: int = 8,
        eval_batch_size: int = 64,
        max_seq_len: int = 512,
        num_workers: int = 0,
        model_name: str = "byt5-tiny",
        seed: int | None = None,
        predict_splits: list[str] = list(SPLITS),
        premise_text: Literal["serialized", "code"] = "serialized",
    ) -> None:
        """
        Args:
            data_path: split folder holding train.json, val.json and test.json.
            corpus_path: the dataset's corpus.jsonl.
            num_negatives: negatives per training pair.
            num_in_file_negatives: how many of them come from the positive premise's own file, at most.
            num_hard_negatives: how many of them are BM25-mined hard negatives: drawn each epoch from the
                `hard_negative_pool` accessible premises BM25 ranks highest for the state, its positives
                excluded (leanagent/data/hard_negatives.py). They come first; in-file and random ones fill the rest.
                2 of 3 measured better than ReProver's 0 in-domain and across datasets (docs/measurements.md); 0 is ReProver's scheme.
            hard_negative_pool: candidates kept per state for hard negatives.
            hard_negatives_by: the ranker that mines them: `bm25`, or `encoder`, the retriever's encoder as the
                fit starts (from `model.init_from`, before any `--ckpt_path`; leanagent/models/encoder_negatives.py),
                so they are its own near misses and a resumed fit mines what the first run mined.
            batch_size: training pairs per batch and device.
            eval_batch_size: tactic states (or premises, when embedding the corpus) per batch.
            max_seq_len: tokens kept of each state and premise.
            num_workers: DataLoader worker processes.
            model_name: linked from the model; chooses the tokenizer.
            seed: drives negative sampling and the training order (with the epoch and the item index);
                null: `seed_everything` where that is a number (the CLI fills it in), else DEFAULT_SEED.
            predict_splits: the splits `predict` retrieves premises for.
            premise_text: `serialized` (ReProver's `Premise.serialize()`: code with the name marked
                `<a>name</a>`, what published ReProver/LeanAgent retrievers read) or `code` (raw).
        """
        super().__init__()
        self.save_hyperparameters()
        if num_negatives < 1:
            raise LeanAgentError(f"data.num_negatives must be at least 1, got {num_negatives}")
        if not 0 <= num_in_file_negatives <= num_negatives:
            raise LeanAgentError(
                f"data.num_in_file_negatives ({num_in_file_negatives}) must lie between 0 "
                f"and data.num_negatives ({num_negatives})"
            )
        if not 0 <= num_hard_negatives <= num_negatives:
            raise LeanAgentError(
                f"data.num_hard_negatives ({num_hard_negatives}) must lie between 0 and data.num_negatives ({num_negatives})"
            )
        if num_hard_negatives and hard_negative_pool < num_hard_negatives:
            raise LeanAgentError(
                f"data.hard_negative_pool ({hard_negative_pool}) must be at least data.num_hard_negatives ({num_hard_negatives})"
            )
        for name, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size), ("max_seq_len", max_seq_len)):
            if value < 1:
                raise LeanAgentError(f"data.{name} must be positive, got {value}")
        if hard_negatives_by not in ("bm25", "encoder"):
            raise LeanAgentError(f"data.hard_negatives_by must be 'bm25' or 'encoder', got {hard_negatives_by!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise LeanAgentError(f"data.seed must be a non-negative integer (or null: seed_everything's), got {seed!r}")
        if num_workers < 0:
            raise LeanAgentError(f"data.num_workers must be 0 (load in the training process) or more, got {num_workers}")
        unknown = [s for s in predict_splits if s not in SPLITS]
        if unknown:
            raise LeanAgentError(f"data.predict_splits: unknown split(s) {unknown}; choose from {list(SPLITS)}")
        refuse_repeats(list(predict_splits), "data.predict_splits", "each is predicted once")
        self.corpus_path = require_file(corpus_path, "data.corpus_path")
        self.data_path = require_folder(data_path, "data.data_path")
        if not any((self.data_path / f"{split}.json").is_file() for split in SPLITS):
            inside = sorted(p.parent.name for p in self.data_path.glob("*/train.json"))
            hint = f"; its split folders: {', '.join(inside)}" if inside else ""
            raise LeanAgentError(
                f"data.data_path {self.data_path}: no train.json, val.json or test.json (not a LeanDojo Benchmark 4 "
                f"split folder such as DATASET/random){hint}"
            )
        self.num_negatives = num_negatives
        self.num_in_file_negatives = num_in_file_negatives
        self.num_hard_negatives = num_hard_negatives
        self.hard_negative_pool = hard_negative_pool
        self.hard_negatives_by = hard_negatives_by
        self._hard_pools: np.ndarray | None = None  # mined by the encoder (`mine_hard_negatives_with`)
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.max_seq_len = max_seq_len
        self.num_workers = num_workers
        self.model_name = model_name
        self.seed = DEFAULT_SEED if seed is None else seed
        self.predict_splits = list(predict_splits)
        if premise_text not in ("serialized", "code"):
            raise LeanAgentError(f"data.premise_text must be 'serialized' or 'code', got {premise_text!r}")
        self.premise_text = premise_text
        self._corpus: Corpus | None = None
        self._corpus_tokens: TokenTable | None = None
        self._corpus_fingerprint: str | None = None
        self._bm25: BM25Index | None = None
        self._tokenizer = None
        self._states: dict[str, TacticStates] = {}
        self._state_tokens: dict[str, TokenTable] = {}
        self._train: TrainingPairs | None = None

    # Settings that decide what the encoder reads: an evaluation must use the ones the checkpoint trained with.
    ENCODER_INPUT_KEYS = ("premise_text", "max_seq_len", "model_name")

    @classmethod
    def for_checkpoint(cls, checkpoint: dict[str, Any], data_path: str, corpus_path: str, **settings: Any) -> "RetrievalDataModule":
        """A data module for evaluating `checkpoint` on another dataset, reading text as its fit did.

        Its data settings (`datamodule_hyper_parameters`, which LightningCLI saves) give premise_text,
        max_seq_len and model_name; the model's own hyperparameters give the last two for checkpoints
        without them. Defaults would embed a model trained on raw code (`premise_text: code`) on serialized
        text. `settings` (eval_batch_size, ...) are passed on.
        """
        saved = dict(checkpoint.get(cls.CHECKPOINT_HYPER_PARAMS_KEY) or {})
        model = dict(checkpoint.get("hyper_parameters") or {})
        inputs = {k: saved[k] if k in saved else model[k] for k in cls.ENCODER_INPUT_KEYS if k in saved or k in model}
        return cls(data_path=data_path, corpus_path=corpus_path, **{**inputs, **settings})

    # Loaded on first use, after the barrier callback has synchronised the ranks.
    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.model_name)
        return self._tokenizer

    @property
    def corpus(self) -> Corpus:
        if self._corpus is None:
            self._corpus = Corpus.from_jsonl(self.corpus_path)
        return self._corpus

    @property
    def corpus_fingerprint(self) -> str:
        """Identifies the encoder's input for the corpus: file content, premise text form, tokenizer, length."""
        if self._corpus_fingerprint is None:
            digest = hashlib.sha256(read_bytes(self.corpus_path, "data.corpus_path"))
            digest.update(f"|{self.premise_text}|{self.model_name}|{self.max_seq_len}".encode())
            self._corpus_fingerprint = digest.hexdigest()
        return self._corpus_fingerprint

    @property
    def corpus_tokens(self) -> TokenTable:
        if self._corpus_tokens is None:
            # Keyed by the corpus file (and the code that turns it into texts): a cache hit skips serialization.
            key = source_key(self.tokenizer, self.max_seq_len, self.corpus_fingerprint, corpus_code_version())
            texts = lambda: self.corpus.premise_texts(self.premise_text)  # noqa: E731
            self._corpus_tokens = tokenize(self.tokenizer, texts, self.max_seq_len, key=key)
        return self._corpus_tokens

    @property
    def bm25_index(self) -> BM25Index:
        """The one BM25 index of the corpus in this process: hard negatives and BM25/hybrid ranking share it."""
        if self._bm25 is None:
            self._bm25 = BM25Index(self.corpus)
        return self._bm25

    def states(self, split: str) -> TacticStates:
        if split not in self._states:
            if split == "predict":
                states = TacticStates()
                for s in self.predict_splits:
                    states.extend(self.states(s))
            else:
                path = require_file(self.data_path / f"{split}.json", f"{split} split")
                states = load_tactic_states(path, self.corpus)
                warn_unresolved(states, str(path))
            self._states[split] = states
            warn_shared_theorems(split, self._states, self.data_path)
        return self._states[split]

    def state_tokens(self, split: str) -> TokenTable:
        if split not in self._state_tokens:
            self._state_tokens[split] = tokenize(self.tokenizer, self.states(split).states, self.max_seq_len)
        return self._state_tokens[split]

    @property
    def train_pairs(self) -> TrainingPairs:
        if self._train is None:
            if self.num_negatives >= len(self.corpus):  # the pairs' table alone grew to tens of GB before the first step
                raise LeanAgentError(f"data.num_negatives ({self.num_negatives}) must be below the {len(self.corpus)} premises of "
                                     f"{self.corpus_path}: a pair's negatives are other premises than its own")
            sampler = NegativeSampler(self.corpus, self.num_negatives, self.num_in_file_negatives, self.num_hard_negatives)
            states = self.train_states()
            pools = self._hard_pools
            if self.wants_encoder_negatives and pools is None:
                raise LeanAgentError(
                    "data.hard_negatives_by is 'encoder', but the module being fit mined none (only the retriever "
                    "does): set data.hard_negatives_by=bm25 for this command"
                )
            if self.num_hard_negatives and pools is None:  # mined by one process per node, read by the others
                pools = shared_hard_negatives(lambda: self.bm25_index, self.corpus, states, self.hard_negative_pool,
                                              self.corpus_fingerprint)
            self._train = TrainingPairs(states, sampler, self.seed, pools)
        return self._train

    def train_states(self) -> TacticStates:
        """The train split's states, or one error naming train.json if none has a premise to learn from:
        checked before anything is mined from them (embedding a large corpus takes minutes)."""
        states = self.states("train")
        require_training_examples(states, self.data_path / "train.json", self.corpus.source)
        return states

    @property
    def wants_encoder_negatives(self) -> bool:
        return bool(self.num_hard_negatives) and self.hard_negatives_by == "encoder"

    def mine_hard_negatives_with(self, ranker: Callable[[], Ranker], ranker_key: str) -> None:
        """Hard-negative pools of the training states mined now by `ranker()`, one process per node (cached by
        `ranker_key`, the encoder's weights), for `train_pairs` to draw from instead of BM25's."""
        self._train = None
        self._hard_pools = shared_hard_negatives(ranker, self.corpus, self.train_states(), self.hard_negative_pool,
                                                 self.corpus_fingerprint, ranker_key=ranker_key)

    # Batches.
    def collate_train(self, items: list[dict[str, Any]], bm25_scores: bool = False) -> dict[str, torch.Tensor]:
        """Queries, then per item its positive followed by its negatives (-1 where none could be drawn).

        labels[i, j] is 1 when candidate j is any positive premise of query i, not only its own (ReProver).
        With `bm25_scores`, `bm25[i, j]` is BM25's score of candidate j for query i (0 where j is padding).
        """
        states = np.asarray([it["state"] for it in items])
        candidates = np.stack([np.concatenate([[it["positive"]], it["negatives"]]) for it in items]).reshape(-1)
        train = self.states("train")
        all_positives = train.positives_array()[states]
        labels = (candidates[None, :, None] == all_positives[:, None, :]).any(-1) & (candidates[None, :] >= 0)
        query_ids, query_mask = self.state_tokens("train").gather(states)
        cand_ids, cand_mask = self.corpus_tokens.gather(candidates)
        return {
            "index": torch.tensor([it["index"] for it in items]),
            "padding": torch.tensor([bool(it.get("padding", False)) for it in items]),
            "query_ids": query_ids,
            "query_mask": query_mask,
            "cand_ids": cand_ids,
            "cand_mask": cand_mask,
            "cand_valid": torch.from_numpy(candidates >= 0),
            "labels": torch.from_numpy(labels.astype(np.float32)),
            # Premise ids of the candidates and of every query's positives, so that candidates shared
            # from other ranks can be labelled too (leanagent/models/retriever.py, `share_candidates`).
            "cand_premises": torch.from_numpy(candidates),
            "query_positives": torch.from_numpy(all_positives),
            **({"bm25": self.bm25_index.candidate_scores([train.states[i] for i in states], candidates)}
               if bm25_scores else {}),
        }

    def collate_eval(self, split: str, indices: list[int]) -> dict[str, torch.Tensor]:
        rows = np.asarray(indices, dtype=np.int64)
        states = self.states(split)
        query_ids, query_mask = self.state_tokens(split).gather(rows)
        return {
            "index": torch.from_numpy(rows),
            "query_ids": query_ids,
            "query_mask": query_mask,
            "file_ids": torch.tensor([states.file_ids[i] for i in rows], dtype=torch.long),
            "pos_keys": torch.tensor([states.pos_keys[i] for i in rows], dtype=torch.long),
            "positives": torch.from_numpy(states.positives_array()[rows]),
        }

    def collate_corpus(self, premise_ids: list[int]) -> dict[str, torch.Tensor]:
        ids, mask = self.corpus_tokens.gather(np.asarray(premise_ids, dtype=np.int64))
        return {"premise_ids": torch.tensor(premise_ids, dtype=torch.long), "ids": ids, "mask": mask}

    # Loaders.
    def _world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)

    def _loader(
        self, dataset: Dataset, batch_size: int, collate, exact: bool, shuffle: bool = False, never_empty: bool = False
    ) -> DataLoader:
        """`exact` loaders give each rank a disjoint shard with no padding, so nothing is counted twice."""
        sampler = None
        if exact:
            world_size, rank = self._world()
            sampler = UnpaddedDistributedSampler(dataset, num_replicas=world_size, rank=rank, never_empty=never_empty)
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle if sampler is None else False,
            sampler=sampler,
            collate_fn=collate,
            num_workers=self.num_workers,
            worker_init_fn=ignore_stop_signals,
            persistent_workers=False,
        )

    def train_dataloader(self) -> DataLoader:
        """In the order the module being fit asks for (`train_order`, models/data_contract.py); shuffled by default."""
        trainer = getattr(self, "trainer", None)
        module = getattr(trainer, "lightning_module", None)
        order = module.train_order() if isinstance(module, OrdersTraining) else TrainOrder()
        collate = partial(self.collate_train, bm25_scores=order.bm25_scores)
        world_size, rank = self._world()
        if order.how != "shuffled":
            # single_pass: Lightning runs a collective every training step, so every rank needs as many
            # batches: shards are padded with marked copies that the Fisher leaves out. in_order: Lightning
            # would inject a shuffled sampler into any training loader; a DistributedSampler is kept.
            sampler = (UnpaddedDistributedSampler(self.train_pairs, world_size, rank, equal_length=True)
                       if order.how == "single_pass" else
                       DistributedSampler(self.train_pairs, num_replicas=world_size, rank=rank, shuffle=False))
            return DataLoader(self.train_pairs, batch_size=self.batch_size, sampler=sampler, collate_fn=collate,
                              num_workers=self.num_workers, worker_init_fn=ignore_stop_signals)
        sampler = EpochShuffledSampler(self.train_pairs, num_replicas=world_size, rank=rank, seed=self.seed)
        if order.resume is not None:
            sampler.skip_epoch, sampler.skip = order.resume[0], order.resume[1] * self.batch_size
        return ResumableLoader(
            self.train_pairs, batch_size=self.batch_size, sampler=sampler, collate_fn=collate,
            num_workers=self.num_workers, worker_init_fn=ignore_stop_signals, position=lambda: trainer.fit_loop.epoch_loop.batch_progress.current.processed,
        )

    def check_split(self, split: str) -> TacticStates:
        """The split's tactic states, or one error naming its file if there are none to evaluate, or (val and
        test) none with a premise of the corpus to find."""
        states = self.states(split)
        if len(states) == 0:
            where = self.data_path / f"{split}.json" if split != "predict" else f"data.predict_splits {self.predict_splits}"
            raise LeanAgentError(f"{where}: no tactic states to evaluate")
        if split != "predict":
            require_positives(states, self.data_path / f"{split}.json", self.corpus_path)
        return states

    def eval_dataloader(self, split: str) -> DataLoader:
        states = self.check_split(split)
        return self._loader(
            EvalStates(states), self.eval_batch_size, partial(self.collate_eval, split), exact=True, never_empty=True
        )

    def val_dataloader(self) -> DataLoader:
        return self.eval_dataloader("val")

    def test_dataloader(self) -> DataLoader:
        return self.eval_dataloader("test")

    def predict_dataloader(self) -> DataLoader:
        return self.eval_dataloader("predict")

    def corpus_dataloader(self, premise_ids: np.ndarray) -> DataLoader:
        return DataLoader(
            premise_ids.tolist(), batch_size=self.eval_batch_size, collate_fn=self.collate_corpus, num_workers=0
        )
