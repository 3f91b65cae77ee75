"""The [num_premises, dim] corpus matrix that validation, test and predict search, embedded once per weights."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import numpy as np
import pytorch_lightning as pl
import torch

from leanagent.models.data_contract import RetrievalData
from leanagent.retrieval.dense import SearchCorpus, search_dtype
from leanagent.compat import tensor_version
from leanagent.faults.watchdog import beat


class CorpusEmbeddings:
    """The corpus embeddings of the current weights and encoder input, kept until either may have changed.

    Every in-place change of a parameter (optimizer step, load_state_dict) bumps its `_version`, so
    the key changes whenever the weights may have, whoever changed them.
    """

    def __init__(self) -> None:
        self.matrix: torch.Tensor | None = None
        self._key: tuple | None = None
        self._search = SearchCorpus()

    def clear(self) -> None:
        self.matrix = None
        self._search.clear()

    def ensure(self, encoder: torch.nn.Module, fingerprint: str, device: torch.device,
               compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The matrix, computed by `compute` unless the weights, corpus input and device are those it was computed for."""
        key = (tuple((p.data_ptr(), tensor_version(p)) for p in encoder.parameters()), fingerprint, str(device))
        if self.matrix is None or self._key != key:
            self._search.clear()
            self.matrix = compute()
            self._key = key
        return self.matrix

    def for_search(self, device: torch.device) -> torch.Tensor:
        """The matrix in the dtype this step's matmul runs in (bf16 under `bf16-mixed`).

        Cast on the first batch of an evaluation (hooks outside the steps run without autocast) and
        kept, so no batch casts the [num_premises, dim] matrix again.
        """
        return self._search.get(self.matrix, search_dtype(device))


@torch.no_grad()
def embed_corpus(module: pl.LightningModule, data: RetrievalData, dim: int) -> torch.Tensor:
    """Each rank embeds every W-th premise with `module`; one all_gather assembles the [num_premises, dim] matrix."""
    beat("corpus embedding")  # each forward below counts as progress (leanagent/faults/)
    trainer, device = module.trainer, module.device
    num_premises = len(data.corpus)
    world, rank = trainer.world_size, trainer.global_rank
    mine = np.arange(rank, num_premises, world)
    by_length = np.argsort(data.corpus_tokens.lengths[mine], kind="stable")  # little padding per batch
    # Epoch-start hooks run outside autocast: enter the trainer's precision (bf16 under bf16-mixed), the
    # costliest part of an evaluation; the search re-scores its head in float32 (leanagent/retrieval/dense.py).
    plugin = getattr(trainer, "precision_plugin", None)
    with plugin.forward_context() if plugin is not None else contextlib.nullcontext():
        chunks = [module(batch["ids"].to(device), batch["mask"].to(device))
                  for batch in data.corpus_dataloader(mine[by_length])]
    local = torch.cat(chunks) if chunks else torch.zeros(0, dim, device=device)
    local = local[torch.from_numpy(np.argsort(by_length)).to(device)]
    if world == 1:
        return local
    per_rank = math.ceil(num_premises / world)
    padded = torch.zeros(per_rank, local.shape[1], device=device, dtype=local.dtype)
    padded[: len(local)] = local
    gathered = module.all_gather(padded)  # [world, per_rank, dim]
    out = torch.empty(num_premises, local.shape[1], device=device, dtype=local.dtype)
    for r in range(world):
        count = len(range(r, num_premises, world))
        out[r::world] = gathered[r, :count]
    return out
