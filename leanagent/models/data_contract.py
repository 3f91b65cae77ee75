"""What the models need from the data side, and what they tell it: the one contract between models/ and data/.

The retriever reads its corpus, tactic states and BM25 index through `RetrievalData`, which
data/datamodule.py implements; a training module tells the data side how to order training pairs
by `train_order()` (`OrdersTraining`), and the retriever hands it a `Ranker` to mine hard negatives
with when the data asks for the encoder's. Nothing else crosses between the two.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import torch

from leanagent.corpus.corpus import Corpus
from leanagent.corpus.tactics import TacticStates
from leanagent.retrieval.bm25 import BM25Index


@dataclass(frozen=True)
class TrainOrder:
    """How the training loader must hand out pairs to the module being fit.

    `shuffled`: a new seeded order each epoch; `resume` = (epoch, batches done) of a mid-epoch
    checkpoint, whose remaining batches come first. `in_order`: the dataset's order, every epoch
    (a quantity that depends on batch order stays reproducible). `single_pass`: each pair on
    exactly one rank, shards padded to equal length with copies marked `padding`.
    `bm25_scores`: each batch also carries `bm25`, [B, C] BM25 scores of every query against every
    candidate, for a loss that learns from BM25's ranking (`losses.bm25_distillation_loss`).
    """

    how: Literal["shuffled", "in_order", "single_pass"] = "shuffled"
    resume: tuple[int, int] | None = None
    bm25_scores: bool = False


@runtime_checkable
class OrdersTraining(Protocol):
    """A LightningModule that needs its training pairs in a particular order."""

    def train_order(self) -> TrainOrder: ...


class Ranker(Protocol):
    """Scores for mining hard negatives (data/hard_negatives.py): [B, num_premises], higher meaning closer."""

    name: str  # for the log line
    min_score: float  # candidates score above it (BM25: 0, a premise sharing no term with the state)

    def scores(self, queries: list[str]) -> torch.Tensor: ...


class TokenLengths(Protocol):
    lengths: np.ndarray  # tokens of each row


class RetrievalData(Protocol):
    """The data the retriever evaluates and predicts on (implemented by `RetrievalDataModule`)."""

    eval_batch_size: int  # tactic states per evaluation batch

    @property
    @abstractmethod
    def corpus(self) -> Corpus: ...

    @property
    @abstractmethod
    def corpus_fingerprint(self) -> str:
        """Changes whenever the encoder's input for the corpus may: corpus embeddings are cached by it."""

    @property
    @abstractmethod
    def corpus_tokens(self) -> TokenLengths: ...

    @property
    @abstractmethod
    def bm25_index(self) -> BM25Index:
        """The one BM25 index of this corpus in the process (hard negatives and BM25/hybrid ranking share it)."""

    @abstractmethod
    def states(self, split: str) -> TacticStates:
        """Tactic states of `val`, `test`, `train` or `predict`, in the order their batches index them."""

    @abstractmethod
    def train_states(self) -> TacticStates:
        """The train split's states; raises LeanAgentError naming the file if none has a premise to learn from."""

    @abstractmethod
    def collate_eval(self, split: str, indices: list[int]) -> dict[str, torch.Tensor]:
        """A batch {"index", "query_ids", "query_mask", "file_ids", "pos_keys", "positives"} of a split's states."""

    @abstractmethod
    def corpus_dataloader(self, premise_ids: np.ndarray) -> Iterable[dict[str, torch.Tensor]]:
        """Batches {"premise_ids", "ids", "mask"} of the given premises, in the order given."""

    @property
    @abstractmethod
    def wants_encoder_negatives(self) -> bool:
        """Whether a fit's hard negatives are the encoder's to mine (`data.hard_negatives_by: encoder`)."""

    @abstractmethod
    def mine_hard_negatives_with(self, ranker: Callable[[], Ranker], ranker_key: str) -> None:
        """Mine the training states' hard-negative pools now with `ranker()`; `ranker_key` identifies it."""
