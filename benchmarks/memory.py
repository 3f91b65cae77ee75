"""Peak memory of `fit` and `validate` with N CPU ranks, summed over the whole process tree.

    python -m benchmarks.memory                                   # mathlib-order and a 100k copy, 2 and 4 ranks
    python -m benchmarks.memory --datasets mathlib-order --ranks 2 --commands validate   # a quick run

Datasets: `mathlib-order` (../shared/data/mathlib-order, 40k premises) and `synthetic-100k`, built
from it under --workdir: the corpus again under `Copy1/...`, `Copy2/...` (paths and imports
renamed, so the import DAG stays valid; the last copy is a prefix in topological order, closed
under imports) until --premises premises, and the split theorems copied with renamed `file_path`
and `def_path`s. Each command runs `python main.py ...` in a fresh folder under --workdir while a
sampler reads /proc every --interval seconds and sums, over the launcher and all its descendants,
RSS (`/proc/PID/statm`) and PSS (`/proc/PID/smaps_rollup`: a page shared by k processes counts 1/k,
so a memory-mapped file shared by all ranks is counted once). A run whose tree RSS passes
--limit-gb is killed and reported as exceeding it. Prints figures; asserts nothing.

Measured on the project's shared 2-core machine (24 GB; other jobs running, so wall times are
only indicative), `--train-batches 4 --val-batches 2`, a fresh token cache per run; peak tree
RSS / PSS in GB, before (dense per-rank token tables) -> after (ragged tokens memory-mapped
from one per-node cache):

    dataset          premises  command   ranks  RSS          PSS          wall time
    mathlib-order      39,987  validate  2      1.76 -> 1.53 1.54 -> 1.32 189 s -> 306 s (load 3.5 vs 9)
    mathlib-order      39,987  fit       4      4.48 -> 3.85 4.06 -> 3.36 209 s -> 170 s
    mathlib-order      39,987  validate  4      3.18 -> 2.89 2.77 -> 2.43 181 s -> 163 s
    synthetic-100k    100,018  fit       4      5.72 -> 5.20 5.28 -> 4.65 427 s -> 287 s
    synthetic-100k    100,018  validate  4      4.03 -> 3.32 3.60 -> 2.79 402 s -> 306 s
    synthetic-100k    100,018  validate  2      2.03 -> 1.93 1.84 -> 1.72 407 s -> 324 s

With the cache already built (`--warm-cache true`, a second run on the node), synthetic-100k validate
with 4 ranks peaked at 3.26 GB RSS / 2.76 GB PSS. Fit with 2 ranks was not measured.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from jsonargparse.typing import PositiveInt

from benchmarks.arguments import benchmark_parser, run
from leanagent.corpus.import_order import imports_first

REPO = Path(__file__).resolve().parents[1]
SHARED = next((p for p in (REPO / "shared", REPO.parent / "shared") if p.is_dir()), REPO.parent / "shared") / "data"
PAGE = os.sysconf("SC_PAGE_SIZE")
GB = 1024**3


# Synthetic dataset.
def build_synthetic(source: Path, target: Path, premises: int, split: str = "random") -> Path:
    """`source` plus renamed copies `Copy1/`, `Copy2/`, ... up to about `premises` premises (idempotent)."""
    stamp = target / ".complete"
    if stamp.is_file() and stamp.read_text() == f"{source}|{premises}":
        return target
    records = [json.loads(line) for line in (source / "corpus.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    index = {r["path"]: i for i, r in enumerate(records)}
    order = imports_first({i: [index[p] for p in r["imports"]] for i, r in enumerate(records)})
    per_copy = sum(len(r["premises"]) for r in records)
    known = {r["path"] for r in records}
    out_records = list(records)
    renamed: list[tuple[str, set[str]]] = []  # (prefix, copied paths)
    total, k = per_copy, 0
    while total < premises:
        k += 1
        prefix = f"Copy{k}/"
        copied: set[str] = set()
        for i in order:  # every file after its imports, so any prefix is closed under imports
            if total >= premises:
                break
            r = records[i]
            out_records.append({**r, "path": prefix + r["path"], "imports": [prefix + p for p in r["imports"]]})
            copied.add(r["path"])
            total += len(r["premises"])
        renamed.append((prefix, copied))
    target.mkdir(parents=True, exist_ok=True)
    (target / split).mkdir(exist_ok=True)
    with open(target / "corpus.jsonl", "w", encoding="utf-8") as f:
        for r in out_records:
            f.write(json.dumps(r) + "\n")
    for name in ("train", "val", "test"):
        theorems = json.loads((source / split / f"{name}.json").read_text(encoding="utf-8"))
        out = list(theorems)
        for prefix, copied in renamed:
            for t in theorems:
                if t["file_path"] not in copied:
                    continue
                tactics = []
                for tt in t["traced_tactics"]:
                    text, provenances = tt["annotated_tactic"]
                    provenances = [
                        {**p, "def_path": prefix + p["def_path"]} if p["def_path"] in known else p for p in provenances
                    ]
                    tactics.append({**tt, "annotated_tactic": [text, provenances]})
                out.append({**t, "file_path": prefix + t["file_path"], "traced_tactics": tactics})
        (target / split / f"{name}.json").write_text(json.dumps(out), encoding="utf-8")
    stamp.write_text(f"{source}|{premises}")
    print(f"built {target}: {total:,} premises in {len(out_records):,} files", flush=True)
    return target


# Process-tree memory from /proc.
def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(b")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def tree(pid: int) -> list[int]:
    kids = _children()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def memory(pid: int) -> tuple[int, int | None, int | None]:
    """(RSS, PSS, USS) in bytes of one process; PSS/USS None where smaps_rollup is unreadable."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0, 0, 0
    try:
        fields = {}
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == "kB":
                    fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
        return rss, fields.get("Pss"), fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    except OSError:
        return rss, None, None


def measure(cmd: list[str], cwd: Path, env: dict[str, str], interval: float, limit: float, log: Path) -> dict:
    start = time.monotonic()
    peak = {"rss": 0, "pss": 0, "uss": 0, "procs": 0, "exceeded": False}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _sample(proc, peak, limit, interval)
        finally:
            # Past the limit, or when the benchmark itself is stopped (SIGTERM, Ctrl-C, an error): the run has a
            # session of its own, which a terminal's Ctrl-C does not reach, so it is killed here.
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return {**peak, "rc": proc.returncode, "wall": time.monotonic() - start}


def _sample(proc: subprocess.Popen, peak: dict, limit: float, interval: float) -> None:
    """Sum the memory of `proc`'s tree every `interval` s into `peak` until it ends or passes `limit` bytes
    (`measure` then kills it)."""
    while proc.poll() is None:
        pids = tree(proc.pid)
        rss = pss = uss = 0
        for p in pids:
            r, ps, us = memory(p)
            rss += r
            pss += ps if ps is not None else r
            uss += us if us is not None else r
        peak["rss"], peak["pss"], peak["uss"] = max(peak["rss"], rss), max(peak["pss"], pss), max(peak["uss"], uss)
        peak["procs"] = max(peak["procs"], len(pids))
        if rss > limit:
            peak["exceeded"] = True
            return
        time.sleep(interval)


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["mathlib-order", "synthetic-100k"],
                        help="mathlib-order, synthetic-100k, or a folder with corpus.jsonl and random/")
    parser.add_argument("--ranks", nargs="+", type=PositiveInt, default=[2, 4])
    parser.add_argument("--commands", nargs="+", default=["fit", "validate"], choices=["fit", "validate", "test"])
    parser.add_argument("--premises", type=PositiveInt, default=100_000, help="size of synthetic-100k")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/leanagent-memory"))
    parser.add_argument("--train-batches", type=PositiveInt, default=4)
    parser.add_argument("--val-batches", type=PositiveInt, default=2)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--limit-gb", type=float, default=20.0)
    parser.add_argument("--warm-cache", type=bool, default=False,
                        help="use the default token cache (already built by earlier runs) instead of a fresh one per run")
    parser.add_argument("--extra", nargs="*", default=[], help="more arguments for main.py")
    args = parser.parse_args(argv)

    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_"))}
    env["PYTHONPATH"] = str(REPO)
    rows = []
    for name in args.datasets:
        if name == "mathlib-order":
            data = SHARED / "mathlib-order"
        elif name == "synthetic-100k":
            data = build_synthetic(SHARED / "mathlib-order", args.workdir / "synthetic-100k", args.premises)
        else:
            data = Path(name).resolve()
        premises = sum(len(json.loads(line)["premises"]) for line in open(data / "corpus.jsonl", encoding="utf-8") if line.strip())
        for ranks in args.ranks:
            for command in args.commands:
                run = args.workdir / "runs" / f"{Path(name).name}-{command}-{ranks}"
                run.mkdir(parents=True, exist_ok=True)
                run_env = dict(env)
                if not args.warm_cache:  # each run builds its token cache, as a first run on a node does
                    shutil.rmtree(run / "token-cache", ignore_errors=True)
                    run_env["LEANAGENT_TOKEN_CACHE"] = str(run / "token-cache")
                cmd = [
                    sys.executable, str(REPO / "main.py"), command, "--config", str(REPO / "configs" / "retrieval.yaml"),
                    "--trainer.accelerator=cpu", f"--trainer.devices={ranks}",
                    f"--data.data_path={data / 'random'}", f"--data.corpus_path={data / 'corpus.jsonl'}",
                    f"--trainer.limit_val_batches={args.val_batches}",
                ]
                if command == "fit":
                    cmd += ["--trainer.max_epochs=1", f"--trainer.limit_train_batches={args.train_batches}"]
                else:
                    cmd += [f"--trainer.limit_{command}_batches={args.val_batches}"] if command == "test" else []
                cmd += args.extra
                print(f"running {name} {command} x{ranks}: {' '.join(cmd[1:])}", flush=True)
                result = measure(cmd, run, run_env, args.interval, args.limit_gb * GB, run / "log.txt")
                status = "ok" if result["rc"] == 0 else ("EXCEEDED" if result["exceeded"] else f"rc={result['rc']} (see {run / 'log.txt'})")
                rows.append((name, premises, command, ranks, result, status))
                print(f"  peak tree RSS {result['rss'] / GB:.2f} GB, PSS {result['pss'] / GB:.2f} GB, "
                      f"USS {result['uss'] / GB:.2f} GB, {result['procs']} processes, {result['wall']:.0f} s, {status}", flush=True)

    print()
    print("| dataset | premises | command | ranks | peak tree RSS | peak tree PSS | peak tree USS | wall time | status |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, premises, command, ranks, r, status in rows:
        print(f"| {name} | {premises:,} | {command} | {ranks} | {r['rss'] / GB:.2f} GB | {r['pss'] / GB:.2f} GB | "
              f"{r['uss'] / GB:.2f} GB | {r['wall']:.0f} s | {status} |")


if __name__ == "__main__":
    run(main)
