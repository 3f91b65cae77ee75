"""benchmarks/lifelong_runs.py: several runs' results.json side by side, with their spread; bad files refused."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from benchmarks import lifelong_runs

DOCS = Path(__file__).resolve().parents[2] / "docs"


def summarize(monkeypatch, capsys, *runs: Path) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["lifelong_runs", *map(str, runs)])
    code = 0
    try:
        lifelong_runs.run(lifelong_runs.main)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_two_runs_print_their_diagonals_and_the_mean(tmp_path, monkeypatch, capsys):
    on = json.loads((DOCS / "lifelong-mathlib-ewc-on.json").read_text())
    off = json.loads((DOCS / "lifelong-mathlib-ewc-off.json").read_text())
    (tmp_path / "off").mkdir()
    shutil.copy(DOCS / "lifelong-mathlib-ewc-off.json", tmp_path / "off" / "results.json")  # a run folder works too
    code, out, _ = summarize(monkeypatch, capsys, DOCS / "lifelong-mathlib-ewc-on.json", tmp_path / "off")
    assert code == 0
    rows = {line.split()[0]: [float(x) for x in line.split()[1:]] for line in out.splitlines()[2:]}
    diagonal = [row[i] for i, row in enumerate(on["test_recall10_matrix"])]
    assert rows[str(DOCS / "lifelong-mathlib-ewc-on.json")][:5] == pytest.approx(diagonal, abs=0.05)
    assert rows[str(tmp_path / "off")][5:10] == pytest.approx(off["val_recall10"], abs=0.05)
    mean_ip = (on["metrics"]["IP"] + off["metrics"]["IP"]) / 2
    assert rows["mean"][12] == pytest.approx(mean_ip, abs=0.005)
    assert rows["min"][10] == pytest.approx(min(on["metrics"]["FM"], off["metrics"]["FM"]), abs=0.005)
    assert rows["max"][13] == pytest.approx(on["average_test_recall10"][-1], abs=0.05)


@pytest.mark.parametrize(("edit", "says"), [
    (lambda s: s["metrics"].pop("IP"), "field 'metrics.IP' is missing"),
    (lambda s: s.update(val_recall10=[1.0]), "field 'val_recall10' must be a list of 5 numbers"),
    (lambda s: s["test_recall10_matrix"].pop(), "one row per stage (5)"),
    (lambda s: s.update(order=list(reversed(s["order"]))), "is not the first run's"),
])
def test_a_damaged_or_other_run_is_one_error_line(tmp_path, monkeypatch, capsys, edit, says):
    summary = json.loads((DOCS / "lifelong-mathlib-ewc-on.json").read_text())
    edit(summary)
    bad = tmp_path / "results.json"
    bad.write_text(json.dumps(summary))
    code, out, err = summarize(monkeypatch, capsys, DOCS / "lifelong-mathlib-ewc-on.json", bad)
    assert code == 2 and not out
    (line,) = err.splitlines()
    assert line.startswith(f"error: {bad}") and says in line, line
