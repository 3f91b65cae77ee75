"""The retriever's settings checked when it is built: one `error:` line naming the setting, before any weights exist."""

from __future__ import annotations

import math

from leanagent.errors import LeanAgentError
from leanagent.models.losses import LOSSES
from leanagent.retrieval.fusion import RETRIEVAL_MODES


def check_settings(*, loss: str, num_retrieved: int, lr: float, weight_decay: float, warmup_steps: int,
                   length_bucket: int, chunk_cost: float, bm25_distillation: float, retrieval: str) -> None:
    """Raise LeanAgentError for the first setting out of range (`model.<name> must be ...`)."""
    if loss not in LOSSES:
        raise LeanAgentError(f"model.loss must be one of {LOSSES}, got {loss!r}")
    if num_retrieved < 1:
        raise LeanAgentError(f"model.num_retrieved must be at least 1, got {num_retrieved}")
    for name, value, low in (("lr", lr, 0.0), ("weight_decay", weight_decay, 0.0), ("warmup_steps", warmup_steps, 0)):
        if not (value >= low and math.isfinite(value)) or (name == "lr" and value == 0):
            raise LeanAgentError(f"model.{name} must be {'positive' if name == 'lr' else 'non-negative'}, got {value}")
    if length_bucket < 1:
        raise LeanAgentError(f"model.length_bucket must be at least 1, got {length_bucket}")
    if not (chunk_cost >= 0 and math.isfinite(chunk_cost)):
        raise LeanAgentError(f"model.chunk_cost must be a non-negative number, got {chunk_cost}")
    if not (bm25_distillation >= 0 and math.isfinite(bm25_distillation)):
        raise LeanAgentError(f"model.bm25_distillation must be a non-negative number, got {bm25_distillation}")
    if retrieval not in RETRIEVAL_MODES:
        raise LeanAgentError(f"model.retrieval must be one of {RETRIEVAL_MODES}, got {retrieval!r}")
