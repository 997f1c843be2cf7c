"""The worker renders reasoning in history and the reasoning controls exactly as the API counts
them, and applies Anthropic's max_tokens as a ceiling, on the default model's tokenizer and
weights (mlx-lm's own `apply_chat_template`, the engine's `Preparer`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mlx_lm.utils import load_tokenizer

from shared.queue.config import Settings
from shared.queue.jobs import job_for
from shared.queue.prompt.prompt_tokens import PromptCounter, job_chat_input
from shared.wire.anthropic.messages import MessagesRequest
from shared.wire.chat.completions import ChatCompletionRequest
from shared.wire.errors import ContextLengthError
from tests.shared.thinking_template import HISTORY, THINKING_TEMPLATE
from tests.support import MODEL
from worker.engine.model import LoadedModel, load_model
from worker.engine.prepare import Preparer
from worker.runtime.serve import resolve_model
from worker.runtime.tokenizer_spec import build_spec

CONTEXT = 8192
MODEL_DIR = Path.home() / ".cache" / "mlxq" / "models" / MODEL


@pytest.fixture(scope="module")
def wrapper(settings: Settings) -> Any:
    _, source = resolve_model(settings)
    return load_tokenizer(Path(source))


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    # The test command prepares the default model (scripts/setup.sh): a missing one fails here.
    return load_model(str(MODEL_DIR))


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"reasoning_effort": "none"},
        {"reasoning_effort": "xhigh", "chat_template_kwargs": {"enable_thinking": False}},
    ],
)
def test_the_worker_renders_reasoning_and_controls_as_the_api_counts_them(
    wrapper: Any, extra: dict[str, Any]
) -> None:
    spec = build_spec(wrapper, CONTEXT).model_copy(update={"chat_template": THINKING_TEMPLATE})
    req = ChatCompletionRequest.model_validate({"model": MODEL, "messages": HISTORY, **extra})
    chat = job_chat_input(job_for("chatcmpl-1", req), tools_in_template=False, developer_role=False)
    assert chat is not None
    worker: list[int] = wrapper.apply_chat_template(
        chat.messages,
        tools=chat.tools,
        add_generation_prompt=True,
        chat_template=THINKING_TEMPLATE,
        **chat.variables,
    )
    counter = PromptCounter(spec)
    api = counter.render_chat(chat)
    assert "A greeting is asked for." in api
    assert counter.encode(api, special_tokens=False) == worker


def _message(max_tokens: int) -> MessagesRequest:
    return MessagesRequest.model_validate(
        {"model": MODEL, "max_tokens": max_tokens, "messages": HISTORY[:1]}
    )


def test_a_messages_max_tokens_beyond_the_window_is_a_ceiling_for_the_worker(
    loaded: LoadedModel,
) -> None:
    preparer = Preparer(loaded, default_max_tokens=4096, with_history=False)
    prepared = preparer.prepare(job_for("msg_1", _message(32_000)))
    assert prepared.max_tokens == loaded.context_length - prepared.prompt_tokens
    assert preparer.prepare(job_for("msg_2", _message(300))).max_tokens == 300
    chat = ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": HISTORY[:1], "max_tokens": 32_000}
    )
    with pytest.raises(ContextLengthError, match="maximum context length"):
        preparer.prepare(job_for("chatcmpl-1", chat))


def test_a_ceiling_shrinks_to_the_kv_budget_too(loaded: LoadedModel) -> None:
    preparer = Preparer(loaded, default_max_tokens=4096, with_history=False, kv_window=1000)
    prepared = preparer.prepare(job_for("msg_1", _message(32_000)))
    assert prepared.max_tokens == 1000 - prepared.prompt_tokens
