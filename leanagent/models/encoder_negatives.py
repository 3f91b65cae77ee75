"""Hard negatives mined by the encoder a fit starts from (`data.hard_negatives_by: encoder`).

BM25's near misses are the premises that share words with a state. A pretrained encoder's are the ones
*it* ranks above the right premise, which is what fine-tuning has to correct. They are mined in the
retriever's `setup`, which Lightning runs before it restores a `--ckpt_path`: the weights are those of
`model.init_from` (or the random initialisation), so a resumed or interrupted fit mines the pools of the
run it continues, and the cache (keyed by the weights) hands them over. Every rank embeds its share of the
corpus first (a collective, as in evaluation); then one process per node scores the training states
against it under the cache lock.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

import numpy as np
import torch

from leanagent.errors import LeanAgentError
from leanagent.models.tokenizer import PAD_ID, load_tokenizer

log = logging.getLogger(__name__)


class EncoderRanker:
    """Cosine scores of tactic states against a corpus matrix, with the module's encoder and tokenizer."""

    name = "encoder"
    min_score = float("-inf")  # every accessible premise is a candidate

    def __init__(self, module: Any, corpus: torch.Tensor, max_seq_len: int) -> None:
        self.module = module
        self.corpus = corpus.float()
        self.max_seq_len = max_seq_len
        self.tokenizer = load_tokenizer(module.model_name)

    @torch.no_grad()
    def scores(self, queries: list[str]) -> torch.Tensor:
        tokens, offsets = self.tokenizer.encode_ragged(queries, self.max_seq_len)
        lengths = np.diff(offsets)
        ids = torch.full((len(queries), int(lengths.max(initial=1))), PAD_ID, dtype=torch.long)
        for row, (start, stop) in enumerate(zip(offsets[:-1], offsets[1:])):
            ids[row, : stop - start] = torch.from_numpy(tokens[start:stop].astype(np.int64))
        mask = (torch.arange(ids.shape[1])[None, :] < torch.from_numpy(lengths)[:, None]).long()
        device = self.module.device
        plugin = self.module.trainer.precision_plugin
        with plugin.forward_context():
            embedded = self.module(ids.to(device), mask.to(device))
        return (embedded.float() @ self.corpus.to(device).T).cpu()


def weights_key(module: torch.nn.Module) -> str:
    """sha256 of the encoder's parameters (names and values): which encoder mined a cached pool."""
    digest = hashlib.sha256(b"encoder-negatives-v1")
    for name, parameter in sorted(module.encoder_parameters()):
        digest.update(name.encode() + b"|" + str(parameter.dtype).encode() + b"|")
        digest.update(parameter.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def mine_with_start_encoder(module: Any) -> None:
    """If the data asks for the encoder's hard negatives, mine them now, with the weights as they are."""
    data = module.data
    if not getattr(data, "wants_encoder_negatives", False):  # another datamodule, or BM25 negatives
        return
    data.train_states()  # a train split with nothing to learn fails here, before the corpus is embedded
    module.to(module.trainer.strategy.root_device)  # where the fit will run; Lightning would move it next
    was_training = module.training
    module.eval()
    try:
        started = time.monotonic()
        if module.global_rank == 0:  # on a large corpus this is minutes before the first step: say what runs
            log.info("hard negatives: embedding the corpus with the encoder the fit starts from, then ranking the "
                     "training states with it (the cost of one validation)")
        corpus = module.embed_corpus()  # every rank takes part
        if module.global_rank == 0:
            log.info("hard negatives: %d premises embedded in %.0f s", corpus.shape[0], time.monotonic() - started)
        max_seq_len = int(module.hparams.get("max_seq_len", 512))
        data.mine_hard_negatives_with(lambda: EncoderRanker(module, corpus, max_seq_len), weights_key(module))
    finally:
        module.train(was_training)


def mines_with_encoder(data: Any) -> bool:
    """Whether a fit's `data` config asks for the encoder's hard negatives (mined with `model.init_from`)."""
    return data is not None and data.get("hard_negatives_by") == "encoder" and bool(data.get("num_hard_negatives"))


def check_miner(model_class_path: str | None, data: Any) -> None:
    """Refuse, before anything is written, a fit whose data wants the encoder's hard negatives from a module
    that mines none (only the retriever does; the Fisher pass, for one, draws BM25's)."""
    if not mines_with_encoder(data):
        return
    from leanagent.models.retriever import PremiseRetriever

    if model_class_path not in (f"{PremiseRetriever.__module__}.{PremiseRetriever.__name__}", None):
        raise LeanAgentError(
            f"data.hard_negatives_by: 'encoder' needs model.class_path {PremiseRetriever.__module__}."
            f"{PremiseRetriever.__name__} (got {model_class_path}): set data.hard_negatives_by=bm25"
        )
