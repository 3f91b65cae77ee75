"""LeanAgent's six lifelong-learning metrics (paper Section 4.3, Table 3, Appendix A.4).

Input is the evaluation matrix of a run over T repositories trained one after another:
``r[i][j]`` is test R@10 on repository j after training stage i (0-based), defined for
j <= i. Entries above the diagonal (None, NaN, or a forward evaluation) are ignored.
Rows may be ragged (row i needs i + 1 entries). Any scale works (the paper uses percent);
only CFR is scale-free.

The curve most metrics read is the *average test R@10 after stage k*, the mean over the
repositories seen so far (not over all T, and not the diagonal alone):

    A_k = (1 / (k + 1)) * sum_{j <= k} r[k][j]

This is what LeanAgent's analysis script calls "Average Test R@10" (its stage-2 value is
the mean of two repositories). With that curve, WF5, WP5, CFR and IP below reproduce the
LeanAgent column of Table 4 (0.18, 2.47, 0.88, 1.02) within 0.01 from the authors'
per-repository numbers; see tests/lifelong/test_metrics.py.

FM and EBWT follow the definitions the paper cites (Wang et al. 2024; Diaz-Rodriguez et
al. 2018). The script that produced Table 4 computes both differently (FM takes the best
score of *any* repository at stage s instead of repository s's own best; EBWT compares
stage i - 1 instead of stage i, so it counts the diagonal as zero-change pairs and drops
the last stage), which gives 0.85 and 1.21 where the cited definitions give 0.48 and 1.38.
``paper_script=True`` reproduces the published numbers, for comparison with the paper only.

Where nothing can be compared (a single stage, or no complete window) a metric is 0.0,
as in LeanAgent's script for WF and EBWT; CFR is NaN when every average is 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real

import numpy as np

from leanagent.errors import LeanAgentError

Matrix = Sequence[Sequence[float | None]]

__all__ = [
    "average_test_recall",
    "windowed_forgetting",
    "forgetting_measure",
    "catastrophic_forgetting_resilience",
    "expanded_backward_transfer",
    "windowed_plasticity",
    "incremental_plasticity",
    "lifelong_metrics",
]


def _finite(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise LeanAgentError(f"{where} must be a finite number, got {value!r}")
    return float(value)


def _matrix(r: Matrix) -> np.ndarray:
    """Lower triangle as a T x T float array (NaN above the diagonal); errors name the cell."""
    rows = list(r)
    t = len(rows)
    if t == 0:
        raise LeanAgentError("evaluation matrix is empty: need at least one training stage")
    out = np.full((t, t), np.nan)
    for i, row in enumerate(rows):
        row = list(row)
        if len(row) < i + 1 or len(row) > t:
            raise LeanAgentError(
                f"evaluation matrix row R[{i}] has {len(row)} entries; after stage {i} it needs "
                f"R@10 on repositories 0..{i} (at most {t} entries)"
            )
        for j in range(i + 1):
            if row[j] is None or (isinstance(row[j], float) and math.isnan(row[j])):
                raise LeanAgentError(
                    f"evaluation matrix R[{i}][{j}] is missing: every repository seen so far "
                    "must be evaluated after each stage"
                )
            out[i, j] = _finite(row[j], f"evaluation matrix R[{i}][{j}]")
    return out


def _window(window: int) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise LeanAgentError(f"metric window must be a positive integer, got {window!r}")
    return window


def average_test_recall(r: Matrix) -> list[float]:
    """A_k = mean_{j <= k} r[k][j]: the curve WF, WP and CFR read, one value per stage."""
    m = _matrix(r)
    return [float(np.mean(m[k, : k + 1])) for k in range(len(m))]


def windowed_forgetting(r: Matrix, window: int = 5) -> float:
    """Largest drop of the average test R@10 below its best of the previous `window` stages.

    WF_w = max(0, max_{w <= k < T} (max_{k-w <= m < k} A_m - A_k))

    The paper says "maximum decrease over a sliding window of 5 evaluations"; we take
    LeanAgent's script's reading (only complete windows of w earlier stages, clipped at 0),
    which reproduces Table 4. With T <= w there is no complete window and WF is 0.0, so
    WF5 says nothing about runs of five or fewer repositories: pass a smaller window.
    """
    w = _window(window)
    a = average_test_recall(r)
    worst = 0.0
    for k in range(w, len(a)):
        worst = max(worst, max(a[k - w : k]) - a[k])
    return worst


def forgetting_measure(r: Matrix, *, paper_script: bool = False) -> float:
    """Mean over old repositories of (best earlier R@10 - final R@10), Chaudhry et al. / Wang et al.

    FM = (1 / (T-1)) * sum_{j=0}^{T-2} ( max_{j <= l <= T-2} r[l][j] - r[T-1][j] )

    "Highest performance" is over the stages before the last, as in the cited definition,
    so FM is negative when the final model is the best yet on old repositories.
    `paper_script=True`: LeanAgent's script, FM = mean_s (max_{j <= s} r[s][j] - r[T-1][s]).
    0.0 with a single stage.
    """
    m = _matrix(r)
    t = len(m)
    if t == 1:
        return 0.0
    if paper_script:
        drops = [np.max(m[s, : s + 1]) - m[t - 1, s] for s in range(t - 1)]
    else:
        drops = [np.max(m[j : t - 1, j]) - m[t - 1, j] for j in range(t - 1)]
    return float(np.mean(drops))


def catastrophic_forgetting_resilience(r: Matrix) -> float:
    """CFR = min_k A_k / max_k A_k: the worst point of the run relative to its best (1 = flat).

    NaN when every A_k is 0 (the ratio is undefined).
    """
    a = average_test_recall(r)
    best = max(a)
    return min(a) / best if best != 0 else math.nan


def expanded_backward_transfer(r: Matrix, *, paper_script: bool = False) -> float:
    """Mean change on each old repository from when it was learned to every later stage.

    EBWT = sum_{i=1}^{T-1} sum_{j<i} (r[i][j] - r[j][j]) / (T (T-1) / 2)

    This is Diaz-Rodriguez et al.'s BWT over the whole lifetime, i.e. every (later stage,
    old repository) pair counts once. `paper_script=True`: LeanAgent's script, which uses
    r[i-1][j] in place of r[i][j]. 0.0 with a single stage.
    """
    m = _matrix(r)
    t = len(m)
    if t == 1:
        return 0.0
    shift = 1 if paper_script else 0
    diffs = [m[i - shift, j] - m[j, j] for i in range(1, t) for j in range(i)]
    return float(np.mean(diffs))


def windowed_plasticity(r: Matrix, window: int = 5) -> float:
    """Mean gain of the average test R@10 over the stage `window` steps earlier, clipped at 0.

    WP_w = (1/T) * sum_{k=0}^{T-1} max(0, A_k - A_{max(0, k-w)})

    Table 3 calls it the "max ... increase over a 5-task window", but Table 4's values are
    this mean (LeanAgent's script); early stages compare with A_0, and k = 0 adds a 0.
    """
    w = _window(window)
    a = average_test_recall(r)
    return float(np.mean([max(0.0, a[k] - a[max(0, k - w)]) for k in range(len(a))]))


def incremental_plasticity(val_recall: Sequence[float]) -> float:
    """Mean stage-to-stage change of the current repository's validation R@10.

    IP = (1/(T-1)) * sum_{k=1}^{T-1} (v_k - v_{k-1}) = (v_{T-1} - v_0) / (T-1);
    v_k is validation R@10 on the repository of stage k, after stage k. 0.0 for one stage.
    """
    v = [_finite(x, f"validation R@10 [{k}]") for k, x in enumerate(val_recall)]
    if not v:
        raise LeanAgentError("validation R@10 list is empty: need one value per stage")
    if len(v) == 1:
        return 0.0
    return float(np.mean(np.diff(v)))


def lifelong_metrics(
    r: Matrix, val_recall: Sequence[float], *, window: int = 5, paper_script: bool = False
) -> dict[str, float]:
    """All six metrics, keyed as in the paper's Table 4 (WF/WP keys carry the window)."""
    stages = len(_matrix(r))
    if len(val_recall) != stages:
        raise LeanAgentError(
            f"validation R@10 has {len(val_recall)} values but the evaluation matrix has "
            f"{stages} stages: give one value per stage"
        )
    return {
        f"WF{window}": windowed_forgetting(r, window),
        "FM": forgetting_measure(r, paper_script=paper_script),
        "CFR": catastrophic_forgetting_resilience(r),
        "EBWT": expanded_backward_transfer(r, paper_script=paper_script),
        f"WP{window}": windowed_plasticity(r, window),
        "IP": incremental_plasticity(val_recall),
    }
