"""Hybrid retrieval: fusion at the extreme weights, the weight chosen on val and kept in checkpoints, all modes logged."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from leanagent.data.datamodule import RetrievalDataModule
from leanagent.errors import LeanAgentError
from leanagent.models.loading import load_retriever
from leanagent.models.retriever import PremiseRetriever
from leanagent.retrieval.fusion import DEFAULT_HYBRID_WEIGHT, HYBRID_GRID, Fuser, choose_weight, normalise
from tests.conftest import REPO, run_cli, write_subset


def _scores(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    dense = torch.rand(6, 40, generator=g) * 2 - 1
    sparse = torch.rand(6, 40, generator=g) * 30
    sparse[sparse < 15] = 0  # BM25: most premises share no term
    accessible = torch.rand(6, 40, generator=g) > 0.3
    return dense, sparse, accessible


def _ranking(scores: torch.Tensor, accessible: torch.Tensor) -> torch.Tensor:
    return scores.masked_fill(~accessible, float("-inf")).argsort(dim=1, descending=True, stable=True)


def test_weight_zero_is_the_bm25_ranking_and_weight_one_the_dense_ranking():
    dense, sparse, accessible = _scores()
    fuser = Fuser(dense, sparse, accessible)
    assert torch.equal(_ranking(fuser(0.0), accessible), _ranking(sparse, accessible))
    assert torch.equal(_ranking(fuser(1.0), accessible), _ranking(dense, accessible))
    middle = fuser(0.5)
    assert not torch.equal(_ranking(middle, accessible), _ranking(sparse, accessible))
    assert not torch.equal(_ranking(middle, accessible), _ranking(dense, accessible))
    for scores in (fuser(0.0), fuser(0.5), fuser(1.0)):
        assert torch.isneginf(scores[~accessible]).all() and torch.isfinite(scores[accessible]).all()


def test_normalise_maps_accessible_scores_to_the_unit_interval():
    dense, _, accessible = _scores(1)
    scaled = normalise(dense, accessible)
    assert torch.allclose(scaled.masked_fill(~accessible, 2).amin(dim=1), torch.zeros(6))
    assert torch.allclose(scaled.masked_fill(~accessible, -1).amax(dim=1), torch.ones(6))
    flat = normalise(torch.ones(2, 5), torch.ones(2, 5, dtype=torch.bool))
    assert torch.equal(flat, torch.zeros(2, 5))  # all equal: no division by zero


def _examples(*rows, n=40):
    """Per-example [n, 3] metrics (R@1, R@10, MRR) whose means are `rows`, spread like real 0/100 recalls."""
    out = []
    for r1, r10, mrr in rows:
        hits1 = torch.zeros(n)
        hits1[: round(r1 / 100 * n)] = 100.0
        hits10 = torch.zeros(n)
        hits10[: round(r10 / 100 * n)] = 100.0
        out.append(torch.stack([hits1, hits10, torch.full((n,), mrr)], dim=1))
    return out


def test_choose_weight_takes_the_best_clear_gain_and_the_smallest_weight_on_ties():
    base, = _examples((10.0, 50.0, 0.3))
    per_example = {w: base.clone() for w in HYBRID_GRID}
    assert choose_weight(per_example) == 0.0
    per_example[0.6], per_example[0.7] = _examples((20.0, 80.0, 0.4), (20.0, 80.0, 0.45))
    assert choose_weight(per_example) == 0.7
    per_example[0.8] = per_example[0.7].clone()
    assert choose_weight(per_example) == 0.7


def test_choose_weight_does_not_buy_recall_at_10_with_recall_at_1():
    base, = _examples((10.0, 50.0, 0.3))
    per_example = {w: base.clone() for w in HYBRID_GRID}
    per_example[1.0], per_example[0.5] = _examples((0.0, 65.0, 0.15), (12.5, 57.5, 0.35))
    assert choose_weight(per_example) == 0.5  # 1.0 has the best Recall@10, 0.5 the best R@1 + R@10 + 100 MRR
    per_example[0.5] = base.clone()
    assert choose_weight(per_example) == 0.0  # 1.0 alone: below BM25 on the sum


def test_choose_weight_ignores_a_gain_within_the_noise_of_a_small_split():
    # One example of 27 better on every metric (what one lucky state looks like): not enough to leave BM25.
    base, better = _examples((10.0, 50.0, 0.3), (10.0, 50.0, 0.3), n=27)
    better[-1] = torch.tensor([100.0, 100.0, 1.0])
    per_example = {w: base.clone() for w in HYBRID_GRID}
    per_example[0.5] = better
    assert choose_weight(per_example) == 0.0
    assert choose_weight(per_example, min_gain_z=0.5) == 0.5  # the test, not the metrics, keeps it out


def _gain_of(hits: int, n: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """BM25 finding nothing, and a weight that finds the positive in its first 10 for `hits` of n states."""
    bm25 = torch.zeros(n, 3)
    better = bm25.clone()
    better[:hits, 1] = 100.0
    return bm25, better


def test_choose_weight_tests_only_the_best_weight():
    """2 of 100 states better is z = 1.42, 3 of 100 is z = 1.75: one test at z >= 1.645, however many weights."""
    bm25, _ = _gain_of(0)
    per_example = {w: bm25.clone() for w in HYBRID_GRID}
    per_example[0.5] = _gain_of(2)[1]
    assert choose_weight(per_example) == 0.0
    per_example[0.5] = _gain_of(3)[1]
    assert choose_weight(per_example) == 0.5
    per_example[0.3] = _gain_of(2)[1]  # a weaker weight beside it changes nothing
    assert choose_weight(per_example) == 0.5


def test_choose_weight_tests_the_gain_in_recall_at_10_not_the_noise_of_recall_at_1():
    """12 of 100 states gain the positive in their first 10 (z = 3.6 on Recall@10), while R@1 and MRR swing both
    ways (20 up, 18 down): the sum's z is 1.5, which kept BM25 although the weight is better on every mean."""
    bm25 = torch.zeros(100, 3)
    bm25[20:38] = torch.tensor([100.0, 100.0, 0.7])  # R@1 hits that the weight loses
    bm25[38:50, 2] = 0.1
    weight = bm25.clone()
    weight[:20] = torch.tensor([100.0, 100.0, 0.6])  # R@1 hits it gains (R@10 there was 0 for BM25)...
    weight[:20, 1] = 0.0  # ...without moving R@10, so only states 38-49 gain R@10
    weight[20:38] = torch.tensor([0.0, 100.0, 0.1])
    weight[38:50, 1] = 100.0
    per_example = {w: bm25.clone() for w in HYBRID_GRID}
    per_example[0.5] = weight
    from leanagent.retrieval.fusion import combined_scores, gain_z

    gain = combined_scores(weight) - combined_scores(bm25)
    assert 1.0 < float(gain.mean() / (gain.std() / 10)) < 1.645  # the sum's test would keep BM25
    assert gain_z(weight, bm25) > 3.0
    assert choose_weight(per_example) == 0.5


def test_choose_weight_keeps_bm25_without_validation_examples():
    assert choose_weight({w: torch.zeros(0, 3) for w in HYBRID_GRID}) == 0.0
    with pytest.raises(ValueError, match="BM25's column"):
        choose_weight({0.5: torch.zeros(4, 3)})


def test_unknown_retrieval_mode_is_rejected():
    with pytest.raises(LeanAgentError, match="model.retrieval must be one of"):
        PremiseRetriever(retrieval="sparse")


@pytest.fixture(scope="module")
def unionfind(tmp_path_factory) -> Path:
    """Real states over a corpus of about a hundred premises: evaluation here is mostly embedding the corpus."""
    files = ("Batteries/Data/UnionFind/Basic.lean", "Batteries/Data/UnionFind/Lemmas.lean")
    return write_subset(tmp_path_factory.mktemp("unionfind") / "unionfind", n_train=8, n_eval=8, files=files)


def _trainer() -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)


def _datamodule(dataset: Path) -> RetrievalDataModule:
    return RetrievalDataModule(data_path=str(dataset / "random"), corpus_path=str(dataset / "corpus.jsonl"), max_seq_len=64)


def _reserialised(dataset: Path, target: Path) -> Path:
    """The same premises and splits, with corpus.jsonl written with other bytes (key order, spacing)."""
    shutil.copytree(dataset, target)
    lines = (dataset / "corpus.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    (target / "corpus.jsonl").write_text("".join(json.dumps(r, sort_keys=True, indent=None, separators=(", ", " : ")) + "\n" for r in records))
    assert (target / "corpus.jsonl").read_bytes() != (dataset / "corpus.jsonl").read_bytes()
    return target


def test_validate_logs_dense_under_the_plain_names_and_the_weight_travels_by_premise_set(unionfind, toy_dataset, tmp_path):
    pl.seed_everything(0)
    model = PremiseRetriever(max_seq_len=64, num_retrieved=20)
    assert model.hybrid_weights == {} and model.current_hybrid_weight == DEFAULT_HYBRID_WEIGHT
    trainer = _trainer()
    datamodule = _datamodule(unionfind)
    logged = trainer.validate(model, datamodule=datamodule, verbose=False)[0]
    assert {"Recall@1_val/bm25", "Recall@10_val/hybrid", "MRR_val/hybrid"} <= set(logged)
    assert not any(name.endswith("/dense") for name in logged)  # the plain names are the dense ranking
    dense = model.eval_by_weight[1.0]
    assert [logged["Recall@1_val"], logged["Recall@10_val"], logged["MRR_val"]] == pytest.approx(dense)
    assert logged["Recall@10_val"] != logged["Recall@10_val/bm25"]  # really another ranking than BM25's
    key = datamodule.corpus.premise_set_key
    assert set(model.hybrid_weights) == {key} and model.hybrid_weights[key] in HYBRID_GRID
    assert logged["hybrid_weight_val"] == pytest.approx(model.hybrid_weights[key])
    # Each column is the ranking fused at its weight: BM25 at 0, hybrid at the weight just chosen.
    plain = lambda mode: [logged[f"{m}_val/{mode}"] for m in ("Recall@1", "Recall@10", "MRR")]
    assert plain("bm25") == pytest.approx(model.eval_by_weight[0.0])
    assert plain("hybrid") == pytest.approx(model.eval_by_weight[model.hybrid_weights[key]])

    model.hybrid_weights[key] = 0.7  # a weight no fresh model has, so the round trip is observable
    path = tmp_path / "with_weight.ckpt"
    trainer.save_checkpoint(path)
    assert torch.load(path, weights_only=True)["hybrid_weights"] == {key: 0.7}
    assert load_retriever(path).hybrid_weights == {key: 0.7}
    # An older checkpoint (one weight keyed by the corpus file's bytes) loads with no weight that counts.
    checkpoint = torch.load(path, weights_only=True)
    del checkpoint["hybrid_weights"]
    checkpoint.update(hybrid_weight=0.7, hybrid_corpus=datamodule.corpus_fingerprint)
    torch.save(checkpoint, tmp_path / "old.ckpt")
    old = load_retriever(tmp_path / "old.ckpt")
    assert old.hybrid_weights == {} and old.current_hybrid_weight == DEFAULT_HYBRID_WEIGHT

    # test uses the stored weight: its hybrid column is fused at 0.7, and test never re-chooses it.
    restored = load_retriever(path)
    restored.num_retrieved = 20
    tested = trainer.test(restored, datamodule=_datamodule(unionfind), verbose=False)[0]
    assert tested["hybrid_weight_test"] == pytest.approx(0.7) and restored.hybrid_weights == {key: 0.7}
    # The same premises in a corpus file of other bytes keep the weight ...
    same = trainer.test(restored, datamodule=_datamodule(_reserialised(unionfind, tmp_path / "again")), verbose=False)[0]
    assert same["hybrid_weight_test"] == pytest.approx(0.7)
    assert same["Recall@10_test/hybrid"] == pytest.approx(tested["Recall@10_test/hybrid"])
    # ... and on other premises it does not apply: hybrid falls back to BM25 there.
    elsewhere = trainer.test(restored, datamodule=_datamodule(toy_dataset), verbose=False)[0]
    assert elsewhere["hybrid_weight_test"] == DEFAULT_HYBRID_WEIGHT == 0.0
    assert elsewhere["Recall@10_test/hybrid"] == elsewhere["Recall@10_test/bm25"]
    assert elsewhere["MRR_test/hybrid"] == elsewhere["MRR_test/bm25"]


@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_the_plain_names_are_dense_whatever_predict_writes(mode, toy_dataset):
    pl.seed_everything(0)
    model = PremiseRetriever(max_seq_len=64, num_retrieved=5, retrieval=mode)
    trainer = _trainer()
    logged = trainer.test(model, datamodule=_datamodule(toy_dataset), verbose=False)[0]
    for metric, value in zip(("Recall@1", "Recall@5", "MRR"), model.eval_by_weight[1.0]):  # 5 retrieved: Recall@5
        assert logged[f"{metric}_test"] == pytest.approx(value)
    datamodule = _datamodule(toy_dataset)
    predicted = trainer.predict(model, datamodule=datamodule)
    batch = next(iter(datamodule.predict_dataloader()))
    model._split = "predict"
    model._ensure_corpus_embeddings()
    expected, _ = model.retrieve(batch, mode)
    assert torch.equal(predicted[0]["retrieved"][: len(expected)], expected)


@pytest.mark.slow
def test_cli_validate_logs_dense_bm25_and_hybrid_and_the_command_line_mode_wins(retriever_checkpoint, mini_dataset, tmp_path):
    common = ["validate", "--config", str(REPO / "configs" / "retrieval.yaml"), "--trainer.accelerator=cpu",
              "--trainer.devices=1", "--trainer.enable_progress_bar=false", f"--ckpt_path={retriever_checkpoint}",
              f"--data.data_path={mini_dataset / 'random'}", f"--data.corpus_path={mini_dataset / 'corpus.jsonl'}",
              "--data.max_seq_len=64", "--model.init_args.model_name=byt5-tiny"]  # the fixture's architecture
    found = {}
    for mode in ("hybrid", "bm25"):
        result = run_cli([*common, f"--model.init_args.retrieval={mode}"], cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-4000:]
        found[mode] = {k: float(v) for k, v in re.findall(r"│\s+(\S+_val(?:/\w+)?)\s+│\s+([\d.]+)\s+│", result.stdout)}
    for mode in ("bm25", "hybrid"):
        assert {f"Recall@1_val/{mode}", f"Recall@10_val/{mode}", f"MRR_val/{mode}"} <= set(found["hybrid"])
    # The plain names are the trained ranking, whatever the mode predict would write.
    assert found["hybrid"]["Recall@10_val"] == found["bm25"]["Recall@10_val"]
    assert found["bm25"]["Recall@10_val"] != found["bm25"]["Recall@10_val/bm25"]
    assert found["hybrid"]["hybrid_weight_val"] in HYBRID_GRID
    # Nor does the mode change what validate measures: the same weight is chosen and fused either way.
    assert {k: v for k, v in found["hybrid"].items() if "/" in k or "weight" in k} == \
        {k: v for k, v in found["bm25"].items() if "/" in k or "weight" in k}


def test_lifelong_evaluation_reports_dense_and_hybrid_with_each_datasets_own_weight(retriever_checkpoint, unionfind):
    from leanagent.lifelong.evaluation import evaluate_splits

    datasets = {"mini": (unionfind / "random", unionfind / "corpus.jsonl")}
    evaluated = evaluate_splits(retriever_checkpoint, datasets, ("val", "test"), num_retrieved=20)
    results = evaluated["test"]["mini"]
    model = load_retriever(retriever_checkpoint)
    model.num_retrieved = 20
    logged = _trainer().test(model, datamodule=_datamodule(unionfind), verbose=False)[0]
    for metric in ("Recall@1", "Recall@10", "MRR"):  # the trained ranking under the plain names
        assert results[metric] == pytest.approx(model.eval_by_weight[1.0][("Recall@1", "Recall@10", "MRR").index(metric)])
        assert {f"{metric}/bm25", f"{metric}/hybrid"} <= set(results)
    assert results["Recall@10/bm25"] != results["Recall@10"]  # really two rankings
    # Hybrid on test uses the weight chosen on this dataset's own val, not the checkpoint's (stored elsewhere).
    chosen = evaluated["val"]["mini"]["hybrid_weight"]
    assert results["hybrid_weight"] == chosen
    assert logged["Recall@10_test"] == pytest.approx(results["Recall@10"])


def test_a_fit_that_never_validated_says_its_hybrid_is_bm25(tmp_path, monkeypatch, toy_dataset, capsys):
    """The table after `test_after_fit` must not call a fallback weight chosen: here no epoch was validated."""
    from leanagent.cli import main

    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(REPO / "configs/retrieval.yaml"), "--trainer.accelerator=cpu", "--trainer.devices=1",
          "--trainer.enable_progress_bar=false", f"--data.data_path={toy_dataset / 'random'}",
          f"--data.corpus_path={toy_dataset / 'corpus.jsonl'}", "--data.max_seq_len=32",
          "--trainer.check_val_every_n_epoch=5", "--progressive.epochs_per_repo=1", "--test_after_fit=true",
          "--trainer.callbacks=[]"])  # with callbacks that monitor a val metric, a fit that validates nothing is refused
    out = capsys.readouterr().out
    assert "hybrid weight of the dense side: 0.0 (no validation chose one for these premises, so hybrid is BM25)" in out
