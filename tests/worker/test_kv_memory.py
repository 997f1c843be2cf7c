"""MLXQ_KV_TOKENS on the real default model: one sequence may take the whole budget (up to the
model's window), and the engine refuses, before anything runs, a request whose prompt and
max_tokens could never fit it, naming the settings that size it."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.queue.jobs import job_for
from shared.wire.chat.completions import ChatCompletionRequest
from shared.wire.errors import ContextLengthError
from tests.support import MODEL
from worker.engine.generation.engine import Engine, EngineSettings
from worker.engine.model import load_model

MODEL_DIR = Path.home() / ".cache" / "mlxq" / "models" / MODEL
KV_TOKENS = 300
ROWS = 16


@pytest.fixture(scope="module")
def engine() -> Engine:
    if not MODEL_DIR.is_dir():
        pytest.skip("the default model is not prepared (mlxq prepare-model)")
    loaded = load_model(str(MODEL_DIR))
    return Engine(loaded, EngineSettings(ROWS, 4096, 4096, "slots", kv_tokens=KV_TOKENS))


def _job(max_tokens: int | None) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens}
    )


def test_a_request_beyond_the_whole_kv_budget_is_refused_naming_the_settings(
    engine: Engine,
) -> None:
    with pytest.raises(ContextLengthError, match="MLXQ_POOL_KV_TOKENS") as refused:
        engine.prepare(job_for("big", _job(500)))
    assert "holds 300 tokens" in str(refused.value)


def test_one_sequence_may_take_the_whole_budget_not_a_rows_share(engine: Engine) -> None:
    prepared = engine.prepare(job_for("default", _job(None)))
    assert len(prepared.prompts[0]) + prepared.max_tokens == KV_TOKENS  # not 300 / 16 rows
