"""The hybrid (dense + BM25) weight chosen on validation, one per premise set, kept in the checkpoint.

A weight fitted on one dataset says nothing about how far to trust the encoder on another, so on
other premises hybrid is BM25 (DEFAULT_HYBRID_WEIGHT) until `validate` or `fit` chooses one there.
"""

from __future__ import annotations

from typing import Any

from leanagent.retrieval.fusion import DEFAULT_HYBRID_WEIGHT, MODE_WEIGHTS

CHECKPOINT_KEY = "hybrid_weights"


def weight_for(weights: dict[str, float], premise_set: str | None) -> float:
    """The weight chosen for `premise_set` (`Corpus.premise_set_key`), else DEFAULT_HYBRID_WEIGHT."""
    return weights.get(premise_set, DEFAULT_HYBRID_WEIGHT)


def mode_weight(mode: str, weights: dict[str, float], premise_set: str | None) -> float:
    """The dense weight of a ranking mode: 1 for dense, 0 for BM25, the chosen one for hybrid."""
    return MODE_WEIGHTS.get(mode, weight_for(weights, premise_set))


def save_hybrid_weights(checkpoint: dict[str, Any], weights: dict[str, float]) -> None:
    if weights:
        checkpoint[CHECKPOINT_KEY] = dict(weights)


def load_hybrid_weights(checkpoint: dict[str, Any]) -> dict[str, float]:
    """Valid entries only; older checkpoints (one weight keyed by corpus file bytes) carry none that count."""
    stored = checkpoint.get(CHECKPOINT_KEY)
    stored = stored if isinstance(stored, dict) else {}
    return {
        key: float(w) for key, w in stored.items()
        if isinstance(key, str) and isinstance(w, (int, float)) and 0.0 <= w <= 1.0
    }
