"""Worker tests' shared fixtures."""

from __future__ import annotations

from typing import Any

import pytest

from tests.worker.tiny_models import TINY_LLAMA, tiny_model


@pytest.fixture(scope="module")
def model() -> Any:
    """A tiny randomly initialised llama (tests/worker/tiny_models.py) of 100 tokens, seed 0."""
    return tiny_model({**TINY_LLAMA, "vocab_size": 100}, seed=0)
