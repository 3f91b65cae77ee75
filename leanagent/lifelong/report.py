"""A lifelong run's results: every evaluation as a table (JSON and CSV), the six metrics, and a figure."""

from __future__ import annotations

from pathlib import Path

from leanagent.io import atomic_write, write_csv, write_json
from leanagent.lifelong.metrics import average_test_recall, lifelong_metrics


def evaluation_rows(state: dict) -> list[dict]:
    rows = []
    for stage in state["stages"]:
        for split, results in (("test", stage["test"]), ("val", {stage["repository"]: stage["val"]})):
            for repository, metrics in results.items():
                rows.append({"stage": stage["index"], "trained_on": stage["repository"], "evaluated_on": repository,
                             "split": split, **metrics})
    return rows


def recall_matrix(state: dict) -> list[list[float]]:
    """R[i][j]: test Recall@10 on the j-th repository of the order after stage i (j <= i)."""
    order = state["order"]
    return [[stage["test"][order[j]]["Recall@10"] for j in range(stage["index"] + 1)] for stage in state["stages"]]


def write_report(out: Path, state: dict, window: int = 5) -> dict:
    rows = evaluation_rows(state)
    matrix = recall_matrix(state)
    val = [stage["val"]["Recall@10"] for stage in state["stages"]]
    metrics = lifelong_metrics(matrix, val, window=window)
    summary = {"order": state["order"], "settings": state.get("settings"), "metrics": metrics,
               "test_recall10_matrix": matrix, "average_test_recall10": average_test_recall(matrix),
               "val_recall10": val, "evaluations": rows}
    write_json(out / "results.json", summary)
    write_csv(out / "evaluations.csv", rows)
    write_figure(out / "lifelong.png", state["order"], matrix)
    return summary


def write_figure(path: Path, order: list[str], matrix: list[list[float]]) -> None:
    """Heatmap of test R@10 per repository after each stage, beside the average test R@10 curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    stages = len(matrix)
    grid = np.full((stages, len(order)), np.nan)
    for i, row in enumerate(matrix):
        grid[i, : len(row)] = row
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1.3, 1]})
    image = left.imshow(grid, cmap="viridis", vmin=0, vmax=max(1.0, float(np.nanmax(grid))))
    left.set_xticks(range(len(order)), order, rotation=35, ha="right", fontsize=8)
    left.set_yticks(range(stages), [f"after {order[i]}" for i in range(stages)], fontsize=8)
    left.set_xlabel("evaluated on (test)")
    left.set_title("Test Recall@10 after each stage")
    for i in range(stages):
        for j in range(len(matrix[i])):
            left.text(j, i, f"{grid[i, j]:.1f}", ha="center", va="center", color="white", fontsize=8)
    fig.colorbar(image, ax=left, fraction=0.046)
    average = average_test_recall(matrix)
    right.plot(range(1, stages + 1), average, marker="o")
    right.set_xticks(range(1, stages + 1))
    right.set_xlabel("stage (repositories learned)")
    right.set_ylabel("average test Recall@10 over seen repositories")
    right.set_title("Average test Recall@10")
    right.grid(alpha=0.3)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
