"""Worker tests' shared fixtures."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models import llama


@pytest.fixture(scope="module")
def model() -> Any:
    """A tiny randomly initialised llama: real mlx-lm code, no weights to load."""
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=100,
    )
    mx.random.seed(0)
    return llama.Model(args)
