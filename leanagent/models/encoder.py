"""The T5 encoder behind the retriever: a built-in ByT5-architecture preset offline, or a Hugging Face model."""

from __future__ import annotations

import difflib
import os

import torch
import torch.nn.functional as F
from torch import nn

from leanagent.errors import LeanAgentError

# ByT5's architecture (byte vocabulary, gated-GELU feed-forward, relative attention) at sizes a CPU can train.
PRESETS: dict[str, dict[str, int]] = {
    "byt5-tiny": dict(d_model=64, d_kv=16, num_heads=4, d_ff=128, num_layers=2),
    # The shipped retriever's shape (leanagent/pretrained/): on Mathlib data it gave more dense Recall@10
    # per CPU-minute than byt5-tiny and byt5-cpu (benchmarks/learner_curve.py, docs/measurements.md).
    "byt5-mini": dict(d_model=128, d_kv=32, num_heads=4, d_ff=256, num_layers=3),
    # Wider and deeper, for a CPU with time to spare: several times byt5-mini's cost per training pair.
    "byt5-cpu": dict(d_model=256, d_kv=64, num_heads=4, d_ff=768, num_layers=4),
}
BYT5_VOCAB_SIZE = 384


def is_preset(model_name: str) -> bool:
    return model_name in PRESETS


def refuse_preset_typo(model_name: str) -> None:
    """A name a letter or two off a preset (not a local folder, no owner/ prefix) is a typo, not a hub model:
    said at once, where loading it would first wait for the hub's connection timeout offline."""
    if is_preset(model_name) or "/" in model_name or os.path.exists(model_name):
        return
    close = difflib.get_close_matches(model_name.lower(), PRESETS, n=1, cutoff=0.8)
    if close:
        raise LeanAgentError(f"model_name '{model_name}' is not a built-in preset ({', '.join(PRESETS)}): did you mean "
                             f"'{close[0]}'? (a Hugging Face model is named owner/name, such as google/byt5-small)")


def load_t5_encoder(model_name: str) -> nn.Module:
    """A T5EncoderModel, freshly initialised for a preset or loaded with `from_pretrained` otherwise."""
    from transformers import T5Config, T5EncoderModel

    if is_preset(model_name):
        config = T5Config(
            vocab_size=BYT5_VOCAB_SIZE,
            feed_forward_proj="gated-gelu",
            dropout_rate=0.0,
            is_encoder_decoder=False,
            use_cache=False,
            tie_word_embeddings=False,
            **PRESETS[model_name],
        )
        config._attn_implementation = "eager"
        return T5EncoderModel(config)
    refuse_preset_typo(model_name)
    try:
        return T5EncoderModel.from_pretrained(model_name, attn_implementation="eager")
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LeanAgentError(
            f"model_name '{model_name}' is neither a built-in preset ({', '.join(PRESETS)}) "
            f"nor a loadable Hugging Face model: {first}"
        ) from None


class Encoder(nn.Module):
    """Embeds token ids as L2-normalised masked means of the encoder's last hidden states."""

    def __init__(self, model_name: str) -> None:
        super().__init__()
        # `from_pretrained` returns a model in eval mode, and Lightning (since 2.2) trains modules in the mode
        # it finds them: a Hugging Face model (google/byt5-small: dropout 0.1) would fine-tune without its
        # dropout. Train mode, as a freshly built preset starts; validation switches to eval and back.
        self.t5 = load_t5_encoder(model_name).train()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # A ready 4D additive mask keeps the model free of data-dependent branches, so torch.func.vmap works.
        additive = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        hidden = self.t5(input_ids=input_ids, attention_mask=additive).last_hidden_state
        weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)
        return F.normalize(pooled.float(), dim=-1)
