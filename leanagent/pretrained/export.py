"""Turn a fit's checkpoint into a shipped retriever: `<name>.safetensors` and its record `<name>.json`.

    python -m leanagent.pretrained.export checkpoints/pretrain/last.ckpt --name leanagent-base \
        --command "python main.py fit --config configs/retrieval.yaml --config configs/recipes/pretrain.yaml"

The record says how to reproduce the weights: the command, the resolved data settings, the sha256 of
every data file the fit read (and of a merge's sources, from its `merged_from.json`), the epochs and
steps trained, and the validation metrics in the checkpoint.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

from leanagent.checkpoint_files import load_checkpoint
from leanagent.corpus.provenance import merged_from
from leanagent.errors import LeanAgentError, one_line
from leanagent.io import ensure_writable, file_fingerprints, file_sha256, write_json
from leanagent.pretrained import SHIPPED_DIR, save_encoder


def data_files(data_path: Path, corpus_path: Path) -> list[Path]:
    """The files a fit on this data reads: the corpus and the split folder's three splits."""
    return [corpus_path, *(data_path / f"{split}.json" for split in ("train", "val", "test"))]


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def export(
    checkpoint_path: Path, name: str, command: str, out_dir: Path = SHIPPED_DIR, note: str = "", commit: str | None = None
) -> Path:
    if not name or Path(name).name != name:
        raise LeanAgentError(f"--name: {name!r} must be a file name without folders (the files go in --out-dir)")
    if out_dir.exists() and not out_dir.is_dir():
        raise LeanAgentError(f"--out-dir: {out_dir} is a file")
    ensure_writable(out_dir, "--out-dir")  # under a file, read-only: found before the checkpoint is read
    checkpoint = load_checkpoint(checkpoint_path, "checkpoint")
    hparams, data = checkpoint.get("hyper_parameters"), checkpoint.get("datamodule_hyper_parameters") or {}
    if not isinstance(checkpoint.get("state_dict"), dict) or not isinstance(hparams, dict) or not isinstance(data, dict):
        raise LeanAgentError(f"checkpoint: {checkpoint_path} is not a fit's checkpoint (state_dict and hyper_parameters)")
    if not isinstance(hparams.get("model_name"), str):
        raise LeanAgentError(f"checkpoint: {checkpoint_path}: hyper_parameters has no model_name (not a retriever's checkpoint)")
    tensors, seen = {}, set()
    for key, tensor in checkpoint["state_dict"].items():  # tied tensors (T5's shared embedding) once, first name
        storage = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key.startswith("encoder.") and storage not in seen:
            seen.add(storage)
            tensors[key] = tensor
    if not tensors:
        raise LeanAgentError(f"checkpoint: {checkpoint_path}: its state_dict holds no encoder.* tensors")
    weights = out_dir / f"{name}.safetensors"
    out_dir.mkdir(parents=True, exist_ok=True)
    save_encoder(weights, tensors, hparams["model_name"])
    files = data_files(Path(data["data_path"]), Path(data["corpus_path"])) if data else []
    fingerprints = file_fingerprints(files)
    unread = [str(f) for f in files if str(f) not in fingerprints]
    if not data:
        print("warning: the checkpoint names no data (no datamodule settings): the record has no fingerprint of it",
              file=sys.stderr)
    elif unread:  # a record without them cannot say what the weights were trained and selected on
        print(f"warning: the fit's data is not all here ({', '.join(unread)}): the record has no fingerprint of it; "
              "export where the fit's data is", file=sys.stderr)
    monitor = {k: float(v["best_model_score"]) for k, v in (checkpoint.get("callbacks") or {}).items()
               if isinstance(v, dict) and v.get("best_model_score") is not None}
    record = {
        "name": name,
        "model_name": hparams["model_name"],
        "parameters": int(sum(t.numel() for t in tensors.values())),
        "weights_sha256": file_sha256(weights),
        "command": command,
        "trained_at_commit": commit or git_commit(),
        "epochs": int(checkpoint.get("epoch", -1)) + 1,
        "global_step": int(checkpoint.get("global_step", -1)),
        "model": {k: v for k, v in hparams.items() if not k.startswith("_")},
        "data": {k: v for k, v in data.items() if not k.startswith("_")},
        "data_sha256": fingerprints,
        # The fit's data is often a merge (`python main.py merge`): the files it was made from, as it recorded them.
        "merged_from_sha256": merged_from(Path(data["corpus_path"]).parent) if data else {},
        "best_validation": monitor,
        "note": note,
    }
    write_json(out_dir / f"{name}.json", record)
    return weights


class _Parser(argparse.ArgumentParser):
    """argparse's errors as the app gives them: one `error:` line (argparse prints its usage first)."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {one_line(message)} (python -m leanagent.pretrained.export --help)", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    parser = _Parser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--name", default="leanagent-base")
    parser.add_argument("--command", required=True, help="the exact command that trained the checkpoint")
    parser.add_argument("--note", default="")
    parser.add_argument("--out-dir", type=Path, default=SHIPPED_DIR)
    parser.add_argument("--commit", default=None, help="the commit the fit ran (default: HEAD now)")
    args = parser.parse_args()
    replaced = (args.out_dir / f"{args.name}.safetensors").exists()
    try:
        path = export(args.checkpoint, args.name, args.command, args.out_dir, args.note, args.commit)
    except LeanAgentError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)
    print(f"{'replaced' if replaced else 'wrote'} {path} and {path.with_suffix('.json')}")


if __name__ == "__main__":
    main()
