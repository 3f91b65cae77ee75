"""Turning text into token-id arrays once, so batches only gather rows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from leanagent.errors import LeanAgentError
from leanagent.models.encoder import is_preset, refuse_preset_typo

PAD_ID = 0


class ByteTokenizer:
    """ByT5's tokenizer (UTF-8 bytes shifted by 3, EOS=1, PAD=0), vectorised and file-free."""

    eos_id = 1
    offset = 3
    identity = "byt5-bytes"

    def encode_ragged(self, texts: Sequence[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """Each text's UTF-8 bytes + 3, cut to `max_len` - 1, then EOS; unpadded: (flat uint16 tokens,
        int64 offsets of N+1 row starts)."""
        raws = [text.encode("utf-8")[: max_len - 1] for text in texts]
        offsets = np.zeros(len(raws) + 1, dtype=np.int64)
        np.cumsum(np.fromiter((len(r) + 1 for r in raws), dtype=np.int64, count=len(raws)), out=offsets[1:])
        tokens = np.empty(int(offsets[-1]), dtype=np.uint16)
        body = np.ones(len(tokens), dtype=bool)
        body[offsets[1:] - 1] = False
        tokens[body] = np.frombuffer(b"".join(raws), dtype=np.uint8).astype(np.uint16) + self.offset
        tokens[offsets[1:] - 1] = self.eos_id
        return tokens, offsets


class HFTokenizer:
    """Any Hugging Face tokenizer, truncating like ReProver (`truncation=True`, EOS kept)."""

    def __init__(self, model_name: str) -> None:
        from transformers import AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_name)
        except (OSError, ValueError) as e:
            raise LeanAgentError(f"cannot load the tokenizer of model_name '{model_name}': {e}") from None
        self.identity = f"hf:{model_name}:{type(self.tokenizer).__name__}:{len(self.tokenizer)}"

    def encode_ragged(self, texts: Sequence[str], max_len: int, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
        """The tokenizer's ids of each text, unpadded: (flat tokens, uint16 when the vocabulary allows; int64 offsets)."""
        rows: list[np.ndarray] = []
        for lo in range(0, len(texts), chunk):
            out = self.tokenizer(list(texts[lo : lo + chunk]), max_length=max_len, truncation=True)["input_ids"]
            rows.extend(np.asarray(row, dtype=np.int64) for row in out)
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows)), out=offsets[1:])
        tokens = np.concatenate(rows) if rows else np.empty(0, dtype=np.int64)
        dtype = np.uint16 if tokens.max(initial=0) <= np.iinfo(np.uint16).max else np.int32
        return tokens.astype(dtype), offsets


def load_tokenizer(model_name: str) -> ByteTokenizer | HFTokenizer:
    if is_preset(model_name):
        return ByteTokenizer()
    refuse_preset_typo(model_name)
    return HFTokenizer(model_name)
