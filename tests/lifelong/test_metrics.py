import math

import pytest

from leanagent.errors import LeanAgentError
from leanagent.lifelong.lifelong_metrics import (
    average_test_recall,
    catastrophic_forgetting_resilience,
    expanded_backward_transfer,
    forgetting_measure,
    incremental_plasticity,
    lifelong_metrics,
    windowed_forgetting,
    windowed_plasticity,
)

# Four stages; row i = test R@10 on repositories 0..i after training stage i.
R = [
    [60],
    [58, 70],
    [57, 69, 60],
    [55, 72, 53, 56],
]
VAL = [50, 56, 53, 59]
# Average over repositories seen so far:
#   A0 = 60, A1 = (58+70)/2 = 64, A2 = (57+69+60)/3 = 62, A3 = (55+72+53+56)/4 = 59


def test_average_is_over_repositories_seen_so_far():
    assert average_test_recall(R) == [60.0, 64.0, 62.0, 59.0]


def test_windowed_forgetting_by_hand():
    # w=1: drops A0-A1=-4, A1-A2=2, A2-A3=3 -> 3
    assert windowed_forgetting(R, 1) == pytest.approx(3.0)
    # w=2: k=2: max(60,64)-62=2; k=3: max(64,62)-59=5 -> 5
    assert windowed_forgetting(R, 2) == pytest.approx(5.0)
    # w=3: only k=3: max(60,64,62)-59=5
    assert windowed_forgetting(R, 3) == pytest.approx(5.0)


def test_windowed_forgetting_needs_a_complete_window():
    # T=4 stages: no stage has 4 or 5 earlier ones, so nothing is measured.
    assert windowed_forgetting(R, 4) == 0.0
    assert windowed_forgetting(R, 5) == 0.0


def test_windowed_forgetting_is_clipped_at_zero():
    rising = [[10], [20, 20], [30, 30, 30]]
    assert windowed_forgetting(rising, 1) == 0.0


def test_forgetting_measure_by_hand():
    # repo 0: best before last max(60,58,57)=60, final 55 -> 5
    # repo 1: max(70,69)=70, final 72 -> -2
    # repo 2: max(60)=60, final 53 -> 7
    assert forgetting_measure(R) == pytest.approx((5 - 2 + 7) / 3)


def test_forgetting_measure_paper_script():
    # stage s: max of row s minus final R@10 of repo s
    # s=0: 60-55=5; s=1: max(58,70)-72=-2; s=2: max(57,69,60)-53=16
    assert forgetting_measure(R, paper_script=True) == pytest.approx((5 - 2 + 16) / 3)


def test_cfr_by_hand():
    assert catastrophic_forgetting_resilience(R) == pytest.approx(59 / 64)


def test_expanded_backward_transfer_by_hand():
    # (i,j): (1,0) 58-60=-2; (2,0) 57-60=-3; (2,1) 69-70=-1;
    #        (3,0) 55-60=-5; (3,1) 72-70=+2; (3,2) 53-60=-7  -> -16/6
    assert expanded_backward_transfer(R) == pytest.approx(-16 / 6)


def test_expanded_backward_transfer_paper_script():
    # r[i-1][j]-r[j][j]: (1,0) 0; (2,0) 58-60=-2; (2,1) 0; (3,0) 57-60=-3; (3,1) 69-70=-1; (3,2) 0
    assert expanded_backward_transfer(R, paper_script=True) == pytest.approx(-6 / 6)


def test_windowed_plasticity_by_hand():
    # w=5 (longer than the run): every stage compares with A0: 0, 4, 2, max(0,-1) -> 6/4
    assert windowed_plasticity(R, 5) == pytest.approx(1.5)
    # w=1: 0, 64-60=4, max(0,62-64)=0, max(0,59-62)=0 -> 4/4
    assert windowed_plasticity(R, 1) == pytest.approx(1.0)


def test_incremental_plasticity_by_hand():
    # diffs 6, -3, 6 -> 3
    assert incremental_plasticity(VAL) == pytest.approx(3.0)


def test_lifelong_metrics_dict():
    got = lifelong_metrics(R, VAL)
    assert list(got) == ["WF5", "FM", "CFR", "EBWT", "WP5", "IP"]
    assert got == pytest.approx(
        {"WF5": 0.0, "FM": 10 / 3, "CFR": 59 / 64, "EBWT": -16 / 6, "WP5": 1.5, "IP": 3.0}
    )
    assert list(lifelong_metrics(R, VAL, window=2)) == ["WF2", "FM", "CFR", "EBWT", "WP2", "IP"]


def test_one_stage():
    assert lifelong_metrics([[70.0]], [65.0]) == {
        "WF5": 0.0, "FM": 0.0, "CFR": 1.0, "EBWT": 0.0, "WP5": 0.0, "IP": 0.0,
    }


def test_upper_triangle_ignored_whatever_it_holds():
    padded = [
        [60, None, math.nan, 1],
        [58, 70, None, None],
        [57, 69, 60, 99],
        [55, 72, 53, 56],
    ]
    assert lifelong_metrics(padded, VAL) == lifelong_metrics(R, VAL)


def test_cfr_all_zero_is_nan():
    assert math.isnan(catastrophic_forgetting_resilience([[0.0], [0.0, 0.0]]))


@pytest.mark.parametrize(
    "bad, needle",
    [
        ([], "empty"),
        ([[60], [58, None]], r"R\[1\]\[1\] is missing"),
        ([[60], [58, math.nan]], r"R\[1\]\[1\] is missing"),
        ([[60], [58]], r"R\[1\] has 1 entries"),
        ([[60, 1, 2], [58, 70]], r"R\[0\] has 3 entries"),
        ([[60], ["58", 70]], r"R\[1\]\[0\] must be a finite number"),
        ([[math.inf]], r"R\[0\]\[0\] must be a finite number"),
    ],
)
def test_bad_matrix(bad, needle):
    with pytest.raises(LeanAgentError, match=needle):
        forgetting_measure(bad)


def test_bad_window_and_validation():
    with pytest.raises(LeanAgentError, match="window"):
        windowed_forgetting(R, 0)
    with pytest.raises(LeanAgentError, match="3 values but .* 4 stages"):
        lifelong_metrics(R, VAL[:3])
    with pytest.raises(LeanAgentError, match="empty"):
        incremental_plasticity([])
    with pytest.raises(LeanAgentError, match=r"validation R@10 \[1\]"):
        incremental_plasticity([1.0, None])


# LeanAgent's own run (curriculum of 14 repositories, Table 4 "LeanAgent" column), as
# published with the authors' analysis script: column j = test R@10 on repository j after
# stages j, j+1, ..., 13 (rounded to 4 decimals), and validation R@10 after each stage.
PAPER_COLUMNS = [
    [60.6471, 61.3253, 61.6708, 61.0877, 60.2615, 60.3069, 60.6012, 60.1533, 59.771, 60.0054, 59.9155, 59.8879, 59.6485, 59.4201],
    [65.4859, 65.7519, 66.497, 66.4955, 68.1001, 67.9351, 67.8821, 67.9739, 67.619, 67.6979, 67.5811, 67.7541, 67.5559],
    [60.2407, 61.6017, 61.5332, 62.0646, 61.5917, 62.2865, 63.1743, 62.9537, 62.8481, 62.7963, 62.5731, 62.1577],
    [63.3242, 65.3251, 64.5103, 67.1694, 66.1894, 67.5336, 68.0698, 68.1768, 67.7989, 68.1192, 68.3726],
    [67.058, 67.5066, 68.0783, 68.943, 69.257, 69.0649, 69.1322, 69.1605, 69.47, 69.483],
    [62.5848, 64.1471, 64.1272, 63.795, 63.9761, 63.8622, 63.6622, 64.1114, 63.9821],
    [68.1857, 68.9431, 70.206, 70.1186, 70.0779, 70.219, 69.7448, 69.6667],
    [68.9187, 68.8826, 69.1823, 69.3198, 69.5843, 69.1312, 69.4859],
    [71.0419, 71.1094, 71.0815, 71.4469, 71.1999, 71.554],
    [65.8015, 66.0667, 64.9478, 66.0404, 65.5177],
    [65.2187, 64.7169, 65.352, 65.1386],
    [70.4487, 73.2396, 71.6124],
    [82.7054, 83.1161],
    [81.4583],
]  # fmt: skip
PAPER_VAL = [61.55, 67.99, 62.11, 64.44, 69.52, 63.13, 69.13, 70.35, 69.23, 58.69, 67.33, 77.12, 75.33, 74.85]
PAPER_TABLE4 = {"WF5": 0.18, "FM": 0.85, "CFR": 0.88, "EBWT": 1.21, "WP5": 2.47, "IP": 1.02}


def test_reproduces_paper_table4_leanagent_column():
    n = len(PAPER_COLUMNS)
    rows = [[PAPER_COLUMNS[j][i - j] for j in range(i + 1)] for i in range(n)]
    got = lifelong_metrics(rows, PAPER_VAL, paper_script=True)
    # Table 4 is rounded to 2 decimals, and the script rounded A_k to 2 decimals first.
    assert got == pytest.approx(PAPER_TABLE4, abs=0.01)
    # The cited FM / EBWT definitions differ from the script's on the same run.
    assert round(forgetting_measure(rows), 2) == 0.48
    assert round(expanded_backward_transfer(rows), 2) == 1.38
