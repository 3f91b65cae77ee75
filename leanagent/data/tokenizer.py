"""Turning text into token-id arrays once, so batches only gather rows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from leanagent.errors import LeanAgentError
from leanagent.models.encoder import is_preset

PAD_ID = 0


class ByteTokenizer:
    """ByT5's tokenizer (UTF-8 bytes shifted by 3, EOS=1, PAD=0), vectorised and file-free."""

    eos_id = 1
    offset = 3

    def encode(self, texts: Sequence[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
        ids = np.full((len(texts), max_len), PAD_ID, dtype=np.int32)
        lengths = np.empty(len(texts), dtype=np.int32)
        for i, text in enumerate(texts):
            raw = np.frombuffer(text.encode("utf-8")[: max_len - 1], dtype=np.uint8)
            n = len(raw)
            ids[i, :n] = raw.astype(np.int32) + self.offset
            ids[i, n] = self.eos_id
            lengths[i] = n + 1
        return ids, lengths


class HFTokenizer:
    """Any Hugging Face tokenizer, truncating like ReProver (`truncation=True`, EOS kept)."""

    def __init__(self, model_name: str) -> None:
        from transformers import AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_name)
        except (OSError, ValueError) as e:
            raise LeanAgentError(f"cannot load the tokenizer of model_name '{model_name}': {e}") from None

    def encode(self, texts: Sequence[str], max_len: int, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
        ids = np.full((len(texts), max_len), PAD_ID, dtype=np.int32)
        lengths = np.empty(len(texts), dtype=np.int32)
        for lo in range(0, len(texts), chunk):
            out = self.tokenizer(list(texts[lo : lo + chunk]), max_length=max_len, truncation=True)["input_ids"]
            for i, row in enumerate(out, start=lo):
                ids[i, : len(row)] = row
                lengths[i] = len(row)
        return ids, lengths


def load_tokenizer(model_name: str) -> ByteTokenizer | HFTokenizer:
    return ByteTokenizer() if is_preset(model_name) else HFTokenizer(model_name)


def gather_tokens(ids: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a pre-tokenized table, trimmed to the longest one; row -1 gives an all-padding row."""
    safe = np.where(rows >= 0, rows, 0)
    width = int(max(lengths[safe].max(initial=1), 1))
    out = ids[safe, :width].copy()
    mask = (np.arange(width)[None, :] < lengths[safe][:, None]).astype(np.int64)
    out[rows < 0] = PAD_ID
    mask[rows < 0] = 0
    mask[rows < 0, 0] = 1
    return out.astype(np.int64), mask
