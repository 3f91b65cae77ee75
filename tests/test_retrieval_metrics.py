import re
import pytest
import torch

from leanagent.retrieval.metrics import retrieval_metrics


def test_recall_and_mrr_against_hand_computed_values():
    # Query 0: positives {3, 9}; 3 at rank 2 and 9 at rank 3 -> R@1 0, R@10 100, MRR 1/2.
    # Query 1: positive {4} never retrieved -> 0, 0, 0.
    # Query 2: positives {7, 8, 11}; 7 at rank 1 -> R@1 = 1/3, R@10 = 2/3 (11 absent), MRR 1.
    # Query 3: no positives -> excluded (has_positive 0).
    retrieved = torch.tensor([[5, 3, 9, -1], [1, 2, -1, -1], [7, 0, 8, 6], [1, 2, 3, 4]])
    positives = torch.tensor([[3, 9, -1], [4, -1, -1], [7, 8, 11], [-1, -1, -1]])
    values = retrieval_metrics(retrieved, positives)
    expected = torch.tensor(
        [[0.0, 100.0, 0.5, 1.0], [0.0, 0.0, 0.0, 1.0], [100 / 3, 200 / 3, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]
    )
    torch.testing.assert_close(values, expected)


def test_recall_at_10_counts_only_the_first_ten():
    retrieved = torch.arange(20)[None]
    positives = torch.tensor([[9, 10]])  # rank 10 and rank 11
    r1, r10, mrr, _ = retrieval_metrics(retrieved, positives)[0].tolist()
    assert (r1, r10) == (0.0, 50.0) and abs(mrr - 0.1) < 1e-7


def test_padding_minus_one_is_never_a_hit():
    values = retrieval_metrics(torch.tensor([[-1, -1]]), torch.tensor([[5, -1]]))
    assert values[0, :3].tolist() == [0.0, 0.0, 0.0]


def test_fewer_retrieved_than_ten_measures_recall_at_that_many():
    from leanagent.retrieval.metrics import metric_names, recall_ks

    assert recall_ks(100) == (1, 10) and metric_names(5) == ("Recall@1", "Recall@5", "MRR")
    assert metric_names(1) == ("Recall@1", "MRR")


def test_a_monitored_recall_that_cannot_be_measured_is_refused():
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint

    from leanagent.errors import LeanAgentError
    from leanagent.models.retriever import PremiseRetriever

    model = PremiseRetriever(model_name="byt5-tiny", num_retrieved=5)
    trainer = pl.Trainer(callbacks=[ModelCheckpoint(monitor="Recall@10_val")], logger=False, accelerator="cpu")
    model.trainer = trainer
    with pytest.raises(LeanAgentError, match="monitors Recall@10_val, but model.num_retrieved is 5"):
        model.setup("fit")


@pytest.mark.parametrize("monitor, refused", [
    ("Recall@10_val/hybird", True), ("recall@10_val", True), ("Recall@10_valid", True), ("ewc_penalty_train_epoch", True),
    ("Recall@10_val", False), ("Recall@1_val/hybrid", False), ("MRR_val/bm25", False), ("loss_train_epoch", False),
    ("step", False), ("epoch", False),  # Lightning's own: monitor="step" keeps the latest checkpoints
])
def test_a_monitor_no_fit_logs_is_refused_before_training(monitor, refused):
    """Lightning finds a misspelt monitor only when the first validation ends, with a traceback and the epoch lost."""
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import EarlyStopping

    from leanagent.errors import LeanAgentError
    from leanagent.models.ranking_eval import check_monitors

    callbacks = [EarlyStopping(monitor=monitor, mode="max"), pl.callbacks.LearningRateMonitor()]
    if refused:
        with pytest.raises(LeanAgentError, match=f"EarlyStopping monitors '{re.escape(monitor)}', which this fit does not log"):
            check_monitors(callbacks, 10)
    else:
        check_monitors(callbacks, 10)
    check_monitors([EarlyStopping(monitor="ewc_penalty_train_epoch")], 10, ewc=True)  # logged when EWC is on
