"""Where a derived dataset came from: `merged_from.json`, the sha256 of every source file a merge read.

A model trained on a merge records the merge's own files; this record names the data behind them, so a
shipped retriever's fingerprints reach back to the datasets a user can fetch (leanagent/pretrained/export.py).
"""

from __future__ import annotations

from pathlib import Path

from leanagent.errors import LeanAgentError
from leanagent.io import file_fingerprints, read_json, write_json

MANIFEST = "merged_from.json"
_KEY = "sources_sha256"


def write_manifest(dataset: Path, sources: list[Path]) -> None:
    """Record in `dataset` the sha256 of each file in `sources` that exists, keyed by its path as given."""
    write_json(Path(dataset) / MANIFEST, {_KEY: file_fingerprints(sources)})


def merged_from(dataset: Path) -> dict[str, str]:
    """The source fingerprints recorded in `dataset`; {} where there is no manifest or it is not one
    (it is a record for people, never an input that training depends on)."""
    manifest = Path(dataset) / MANIFEST
    if not manifest.is_file():
        return {}
    try:
        sources = read_json(manifest)
    except LeanAgentError:
        return {}
    sources = sources.get(_KEY) if isinstance(sources, dict) else None
    ok = isinstance(sources, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in sources.items())
    return dict(sources) if ok else {}
