"""The API's prompt-token count equals the worker's, for any conversation and any prompt.

The worker's side is the tokenizer mlx-lm loads for the default model (the one the engine
tokenizes with); the API's is `PromptCounter` built from the spec that worker would publish.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlx_lm.utils import load_tokenizer

from shared.queue.config import Settings
from shared.queue.prompt.prompt_tokens import ChatInput, PromptCounter
from worker.runtime.serve import resolve_model
from worker.runtime.tokenizer_spec import build_spec

CONTEXT = 8192


@pytest.fixture(scope="module")
def wrapper(settings: Settings) -> Any:
    """The default model's tokenizer, from where a worker of the session's settings loads it
    (prepared there first if missing)."""
    _, source = resolve_model(settings)
    return load_tokenizer(Path(source))


@pytest.fixture(scope="module")
def counter(wrapper: Any) -> PromptCounter:
    spec = build_spec(wrapper, CONTEXT)
    assert spec.tokenizer_json is not None, "the default model must be counted exactly"
    assert spec.context_length == CONTEXT
    return PromptCounter(spec)


# Text of every kind: any code point but surrogates (which JSON requests cannot carry).
any_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=200)
messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "developer", "user", "assistant"]),
            "content": any_text | st.sampled_from(["<|im_start|>", "<|im_end|>", "</s>", " "]),
        }
    ),
    min_size=1,
    max_size=6,
)
quick = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@quick
@given(chat=messages)
def test_chat_prompt_counts_agree(counter: PromptCounter, wrapper: Any, chat: list[Any]) -> None:
    expected = len(wrapper.apply_chat_template(chat, add_generation_prompt=True))
    assert counter.count_chat(ChatInput(chat, None)) == expected


@quick
@given(prompt=any_text)
def test_text_prompt_counts_agree(counter: PromptCounter, wrapper: Any, prompt: str) -> None:
    assert counter.count_text(prompt) == len(wrapper.encode(prompt))


def test_a_renderer_the_counter_cannot_reproduce_publishes_the_window_only(wrapper: Any) -> None:
    class CustomRenderer:
        _chat_template = staticmethod(lambda *args, **kwargs: "custom")

        def __getattr__(self, name: str) -> Any:
            return getattr(wrapper, name)

    spec = build_spec(CustomRenderer(), CONTEXT)  # type: ignore[arg-type]
    assert spec.tokenizer_json is None and spec.context_length == CONTEXT
