"""One evaluation of the retriever over a split: per-example metrics for every fusion weight, reduced over ranks once.

Columns are dense weights of the fused ranking: on val the whole HYBRID_GRID (1 = dense, 0 = BM25),
so the hybrid weight can be chosen from it; on test dense, BM25 and the stored hybrid weight. Each
rank fills the rows of the examples it evaluated and one all-reduce sums them at the end (a row
evaluated twice counts once), so the means are over the whole split whatever the world size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from leanagent.errors import LeanAgentError
from leanagent.retrieval.fusion import BASELINE_MODES, HYBRID_GRID, MODE_WEIGHTS, Fuser
from leanagent.retrieval.metrics import metric_names, recall_ks, retrieval_metrics


def check_monitors(callbacks: Iterable[object], num_retrieved: int, ewc: bool = False) -> None:
    """Refuse, before any training, a monitor that this fit never logs: a misspelt name, or a Recall@k that
    `num_retrieved` cannot measure. Lightning finds either only when the first validation ends, with a traceback."""
    measured = {f"Recall@{k}" for k in recall_ks(num_retrieved)}
    val = {f"{name}_val{mode}" for name in metric_names(num_retrieved) for mode in ("", "/bm25", "/hybrid")}
    val |= {"hybrid_weight_val", "num_evaluated_val", "locality_bias_val"}
    losses = ["loss_train", "loss_retrieval_train", "ewc_penalty_train"] if ewc else ["loss_train"]
    logged = val | {f"{loss}_{when}" for loss in losses for when in ("step", "epoch")} | {"epoch", "step"}  # Lightning's
    for callback in callbacks:
        monitor = getattr(callback, "monitor", None)
        if not isinstance(monitor, str) or monitor in logged or monitor.startswith("lr-"):  # lr-*: LearningRateMonitor's
            continue
        if monitor.startswith("Recall@") and monitor.split("_")[0] not in measured:
            raise LeanAgentError(
                f"{type(callback).__name__} monitors {monitor}, but model.num_retrieved is {num_retrieved}, "
                f"so only {', '.join(sorted(measured))} are measured: raise num_retrieved or change the monitor"
            )
        raise LeanAgentError(
            f"{type(callback).__name__} monitors {monitor!r}, which this fit does not log: choose one of "
            f"{', '.join(f'{n}_val' for n in metric_names(num_retrieved))} (the trained dense ranking), the same with "
            "/bm25 or /hybrid, or loss_train_epoch"
        )


def evaluation_weights(split: str, hybrid_weight: float) -> list[float]:
    """The dense weights a split is evaluated at."""
    return sorted({*HYBRID_GRID, hybrid_weight}) if split == "val" else [1.0, 0.0, hybrid_weight]


class RankingEvaluation:
    """Accumulates [example, weight, metric] values; `finish` all-reduces them and keeps examples with a positive."""

    def __init__(self, size: int, weights: list[float], num_retrieved: int, device: torch.device) -> None:
        self.weights = weights
        self.num_retrieved = num_retrieved
        self.names = metric_names(num_retrieved)
        self._values = torch.zeros(size, len(weights), len(self.names) + 1, device=device)  # + has_positive
        self._seen = torch.zeros(size, device=device)

    def add(self, fuser: Fuser, index: torch.Tensor, positives: torch.Tensor) -> None:
        """The batch's metrics at every weight; `index` are the examples' rows, `positives` their premise ids."""
        ks = recall_ks(self.num_retrieved)
        for column, weight in enumerate(self.weights):
            retrieved, _ = fuser.topk(weight, self.num_retrieved)
            self._values[index, column] = retrieval_metrics(retrieved, positives, ks).to(self._values.device)
        self._seen[index] = 1.0

    def finish(self, world_size: int) -> torch.Tensor:
        """[examples with a positive, weights, metrics] over every rank's examples."""
        size, columns, width = self._values.shape
        summed = torch.cat([self._values.reshape(size, -1), self._seen[:, None]], dim=1)
        if dist.is_available() and dist.is_initialized() and world_size > 1:
            dist.all_reduce(summed)
        seen = summed[:, -1]
        per_example = (summed[:, :-1][seen > 0] / seen[seen > 0, None]).reshape(-1, columns, width)  # a duplicate counts once
        return per_example[per_example[:, 0, -1] > 0, :, :-1]

    def means(self, per_example: torch.Tensor) -> dict[float, list[float]]:
        """{weight: [mean of each metric]} (zeros when no example has a positive)."""
        means = per_example.mean(dim=0) if len(per_example) else torch.zeros(len(self.weights), len(self.names))
        return {w: [float(v) for v in means[c]] for c, w in enumerate(self.weights)}


def logged_metrics(suffix: str, names: tuple[str, ...], means: dict[float, list[float]],
                   mode_weight: Callable[[str], float], hybrid_weight: float) -> dict[str, float]:
    """Metric names as checkpoints, early stopping and reports read them.

    The plain names (`Recall@10_val`) are the learner's own ranking (dense), whatever `retrieval`
    makes predict write; BM25 and hybrid sit beside them (`Recall@10_val/bm25`, `/hybrid`).
    """
    results = {f"{name}_{suffix}": v for name, v in zip(names, means[MODE_WEIGHTS["dense"]])}
    for mode in BASELINE_MODES:
        results.update({f"{name}_{suffix}/{mode}": v for name, v in zip(names, means[mode_weight(mode)])})
    results[f"hybrid_weight_{suffix}"] = hybrid_weight
    return results
