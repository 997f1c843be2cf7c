"""Tiny randomly initialised models for the worker's tests: real mlx-lm code, no weights to load,
small enough to run on the CPU in milliseconds. One llama's shape, which other families and
sizes vary by overriding its fields."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.utils import _get_classes

VOCAB = 64
TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": VOCAB,
    "tie_word_embeddings": True,
}


def tiny_model(config: dict[str, Any], seed: int = 7) -> Any:
    """The model `config` describes (mlx-lm's classes for its model_type), its weights drawn
    from `seed` and evaluated."""
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    return model
