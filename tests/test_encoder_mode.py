"""A Hugging Face encoder starts training in train mode, as a built-in preset does."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import T5Config, T5EncoderModel

from leanagent.models.encoder import Encoder


def _saved_hf_encoder(folder: Path, dropout: float) -> Path:
    config = T5Config(vocab_size=384, d_model=16, d_kv=4, num_heads=2, d_ff=32, num_layers=1,
                      feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False,
                      tie_word_embeddings=False, dropout_rate=dropout)
    T5EncoderModel(config).save_pretrained(folder)
    return folder


def test_a_loaded_hugging_face_encoder_trains_with_its_dropout(tmp_path):
    encoder = Encoder(str(_saved_hf_encoder(tmp_path / "hf", dropout=0.5)))
    assert [name for name, m in encoder.named_modules() if not m.training] == []
    ids = torch.randint(3, 384, (2, 12))
    mask = torch.ones_like(ids)
    # Dropout on: two passes differ; in eval mode they agree.
    assert not torch.allclose(encoder(ids, mask), encoder(ids, mask))
    encoder.eval()
    assert torch.allclose(encoder(ids, mask), encoder(ids, mask))


def test_a_preset_starts_in_train_mode_too():
    assert all(m.training for m in Encoder("byt5-tiny").modules())
