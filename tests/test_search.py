"""Dense search and masked top-k: the corpus is cast to the evaluation dtype once, padding is -1, bf16 ranks as fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F

import leanagent.models.retriever as retriever_module
from leanagent.data.datamodule import RetrievalDataModule
from leanagent.models.retriever import PremiseRetriever
from leanagent.retrieval.bm25 import masked_topk
from leanagent.retrieval.dense import SearchCorpus, dense_scores, rescore_head, search_dtype
from leanagent.retrieval.fusion import Fuser


def _scores_and_mask(seed: int = 0, rows: int = 8, premises: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, premises, generator=g)
    accessible = torch.rand(rows, premises, generator=g) < 0.3
    accessible[0] = False  # nothing accessible
    accessible[1, :] = False
    accessible[1, [3, 7]] = True  # two accessible, fewer than k
    return scores, accessible


def test_masked_topk_pads_with_minus_one_and_never_returns_an_inaccessible_premise():
    scores, accessible = _scores_and_mask()
    k = 10
    ids, top = masked_topk(scores, accessible, k)
    assert ids.shape == top.shape == (8, k)
    for row in range(8):
        allowed = accessible[row].nonzero().flatten()
        count = min(k, len(allowed))
        assert (ids[row, count:] == -1).all() and torch.isneginf(top[row, count:]).all()
        assert accessible[row, ids[row, :count]].all()
        best = allowed[scores[row, allowed].argsort(descending=True)[:count]]
        assert torch.equal(ids[row, :count], best)
    assert ids[0].eq(-1).all() and set(ids[1, :2].tolist()) == {3, 7}


def test_masked_topk_in_place_fills_the_scores_and_agrees_with_the_copy():
    scores, accessible = _scores_and_mask(1)
    expected = masked_topk(scores, accessible, 12)
    filled = scores.clone()
    got = masked_topk(filled, accessible, 12, in_place=True)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert torch.isneginf(filled[~accessible]).all() and torch.equal(filled[accessible], scores[accessible])
    assert masked_topk(scores, accessible, 500)[0].shape == (8, 50)  # k above the corpus size


@pytest.mark.parametrize("weight", [0.0, 0.4, 1.0])
def test_fuser_topk_is_the_masked_topk_of_its_scores(weight):
    dense, accessible = _scores_and_mask(2)
    sparse = torch.rand(dense.shape, generator=torch.Generator().manual_seed(3)) * 20
    fuser = Fuser(dense.clone(), sparse.clone(), accessible)
    ids, top = fuser.topk(weight, 10)
    expected_ids, expected_top = masked_topk(fuser(weight).clone(), accessible, 10)
    assert torch.equal(ids, expected_ids) and torch.equal(top, expected_top)


def _planted(premises: int = 600, dim: int = 256, queries: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries whose 10 best premises have cosines 0.95, 0.90, ..., 0.50, far above the rest (~0.06 std)."""
    g = torch.Generator().manual_seed(0)
    corpus = F.normalize(torch.randn(premises, dim, generator=g), dim=1)
    query = F.normalize(torch.randn(queries, dim, generator=g), dim=1)
    planted = torch.randperm(premises, generator=g)[: queries * 10].view(queries, 10)
    for b in range(queries):
        for j, p in enumerate(planted[b].tolist()):
            c = 0.95 - 0.05 * j
            noise = torch.randn(dim, generator=g)
            noise = F.normalize(noise - (noise @ query[b]) * query[b], dim=0)
            corpus[p] = c * query[b] + (1 - c * c) ** 0.5 * noise
    return query, corpus, planted


def test_bf16_search_ranks_well_separated_premises_as_fp32_does():
    query, corpus, planted = _planted()
    accessible = torch.ones(len(query), len(corpus), dtype=torch.bool)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        dtype = search_dtype(torch.device("cpu"))
        low = SearchCorpus().get(corpus, dtype)
        low_scores = dense_scores(query, low)
    assert dtype == torch.bfloat16 and low.dtype == torch.bfloat16 and low_scores.dtype == torch.bfloat16
    exact_scores = dense_scores(query, SearchCorpus().get(corpus, search_dtype(torch.device("cpu"))))
    assert exact_scores.dtype == torch.float32
    low_ids, _ = Fuser(low_scores, None, accessible).topk(1.0, 10)
    exact_ids, _ = Fuser(exact_scores, None, accessible).topk(1.0, 10)
    assert torch.equal(exact_ids, planted) and torch.equal(low_ids, planted)
    # Hybrid normalises bf16 dense scores in float32: [0, 1] on accessible premises, the same ranking.
    sparse = torch.zeros_like(exact_scores)
    fused = Fuser(low_scores.clone(), sparse.clone(), accessible)(0.5)
    assert fused.dtype == torch.float32 and fused.min() >= 0 and fused.max() <= 0.5 + 1e-6
    assert torch.equal(Fuser(low_scores, sparse, accessible).topk(0.5, 10)[0], planted)


def test_rescoring_the_head_in_fp32_gives_back_the_top_10_that_bf16_near_ties_swap():
    g = torch.Generator().manual_seed(0)
    corpus = F.normalize(torch.randn(4000, 256, generator=g), dim=1)
    query = F.normalize(torch.randn(64, 256, generator=g), dim=1)
    accessible = torch.rand(64, 4000, generator=g) < 0.5
    accessible[0] = False
    accessible[0, :5] = True  # fewer accessible than the re-scored head: padding stays last
    exact_ids, exact_scores = masked_topk(dense_scores(query, corpus), accessible, 20)
    low = corpus.bfloat16()
    plain_ids, _ = Fuser(dense_scores(query, low), None, accessible).topk(1.0, 20)
    rescore = lambda ids, scores: rescore_head(ids, scores, query, corpus)
    ids, scores = Fuser(dense_scores(query, low), None, accessible, rescore).topk(1.0, 20)
    assert not torch.equal(plain_ids[:, :10], exact_ids[:, :10])  # bf16 alone swaps near-ties here
    assert torch.equal(ids[:, :10], exact_ids[:, :10]) and scores.dtype == torch.float32
    assert torch.allclose(scores[1:, :10], exact_scores[1:, :10])
    assert torch.equal(ids[0, 5:], torch.full((15,), -1)) and set(ids[0, :5].tolist()) == set(range(5))


def test_search_corpus_is_the_embeddings_themselves_in_fp32_and_one_cast_in_bf16():
    cache = SearchCorpus()
    embeddings = torch.randn(30, 8)
    assert cache.get(embeddings, torch.float32) is embeddings
    cast = cache.get(embeddings, torch.bfloat16)
    assert cast.dtype == torch.bfloat16 and cache.get(embeddings, torch.bfloat16) is cast
    assert cache.get(embeddings.clone(), torch.bfloat16) is not cast  # new embeddings: cast again


def _datamodule(dataset: Path) -> RetrievalDataModule:
    return RetrievalDataModule(data_path=str(dataset / "random"), corpus_path=str(dataset / "corpus.jsonl"),
                               max_seq_len=64, eval_batch_size=1)


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_evaluation_searches_one_corpus_tensor_in_the_eval_dtype_with_the_scores_autocast_gave(precision, toy_dataset, monkeypatch):
    seen: list[tuple[int, torch.dtype, bool]] = []

    def spy(queries: torch.Tensor, corpus: torch.Tensor) -> torch.Tensor:
        scores = dense_scores(queries, corpus)
        per_batch_cast = queries @ model.corpus_embeddings.T  # what autocast did before: cast the corpus here
        seen.append((id(corpus), corpus.dtype, torch.equal(scores, per_batch_cast)))
        return scores

    monkeypatch.setattr(retriever_module, "dense_scores", spy)
    pl.seed_everything(0)
    model = PremiseRetriever(max_seq_len=64, num_retrieved=5)
    trainer = pl.Trainer(accelerator="cpu", devices=1, precision=precision, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.test(model, datamodule=_datamodule(toy_dataset), verbose=False)
    trainer.test(model, datamodule=_datamodule(toy_dataset), verbose=False)
    expected = torch.bfloat16 if precision == "bf16-mixed" else torch.float32
    assert len(seen) == 4  # two batches, two evaluations
    assert len({corpus for corpus, _, _ in seen}) == 1  # one tensor, cast once, never per batch
    assert all(dtype == expected and same for _, dtype, same in seen)
    assert model.corpus_embeddings.dtype == torch.float32
    if precision == "32-true":
        assert seen[0][0] == id(model.corpus_embeddings)  # fp32: no copy, the ranking is unchanged
