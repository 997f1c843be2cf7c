"""MLXQ_KV_MEMORY on the real default model: the engine sizes each row from the limit and
refuses, before anything runs, a request whose prompt and max_tokens cannot fit a row."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.queue.jobs import job_for
from shared.wire.completions import ChatCompletionRequest
from shared.wire.errors import ContextLengthError
from tests.support import MODEL
from worker.engine.batch.token_batch import kv_bytes_per_token
from worker.engine.generation import Engine
from worker.engine.model import load_model

MODEL_DIR = Path.home() / ".cache" / "mlxq" / "models" / MODEL
KV_MIB = 64
ROWS = 16


@pytest.fixture(scope="module")
def engine() -> Engine:
    if not MODEL_DIR.is_dir():
        pytest.skip("the default model is not prepared (mlxq prepare-model)")
    loaded = load_model(str(MODEL_DIR))
    return Engine(loaded, ROWS, 4096, 4096, batch="slots", kv_memory=KV_MIB)


def _job(max_tokens: int | None) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens}
    )


def test_a_request_beyond_a_row_of_kv_memory_is_refused_naming_the_setting(
    engine: Engine,
) -> None:
    with pytest.raises(ContextLengthError, match="MLXQ_KV_MEMORY"):
        engine.prepare(job_for("big", _job(500)))


def test_a_request_without_max_tokens_gets_what_a_row_has_left(engine: Engine) -> None:
    row = (KV_MIB << 20) // (ROWS * kv_bytes_per_token(engine._loaded.model))
    prepared = engine.prepare(job_for("default", _job(None)))
    assert len(prepared.prompts[0]) + prepared.max_tokens == row
