"""The API's prompt-token count equals the worker's, for any conversation and any prompt.

The worker's side is the tokenizer mlx-lm loads for the default model (the one the engine
tokenizes with); the API's is `PromptCounter` built from the spec that worker would publish.
"""

from __future__ import annotations

import threading
import time
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


def test_counting_a_long_prompt_lets_the_processs_other_threads_run(counter: PromptCounter) -> None:
    """The API counts off its hub (api/http/off_hub.py): the hub's thread must get turns while
    a long prompt is tokenized, not wait for the whole of it."""
    prompt = " ".join(f"word{i}" for i in range(80_000))  # about half a second to tokenize
    ticks: list[float] = []
    counting = threading.Event()

    def tick() -> None:
        while counting.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    counting.set()
    ticker = threading.Thread(target=tick)
    ticker.start()
    started = time.perf_counter()
    counter.count_text(prompt)
    took = time.perf_counter() - started
    counting.clear()
    ticker.join()
    during = [t for t in ticks if started < t < started + took]
    # A tick every millisecond or so; a tokenizer holding the GIL allows one or two in all.
    assert len(during) > took * 1000 / 10, (len(during), took)
