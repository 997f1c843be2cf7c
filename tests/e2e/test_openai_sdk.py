"""The OpenAI SDK, unchanged but for base_url, against the whole stack on the real model."""

from __future__ import annotations

import openai
import pytest

from tests.support import MODEL

HAIKU = [{"role": "user", "content": "Write a haiku about the sea."}]
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def stream_chat(client: openai.OpenAI, **kwargs: object) -> tuple[list[str], list[object]]:
    chunks = list(client.chat.completions.create(model=MODEL, stream=True, **kwargs))  # type: ignore[call-overload]
    texts = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    return texts, chunks


def test_chat_completion_answers_and_stops_on_its_end_token(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0)
    assert reply.object == "chat.completion"
    assert reply.id.startswith("chatcmpl-")
    assert reply.model == MODEL
    assert "Paris" in (reply.choices[0].message.content or "")
    assert reply.choices[0].finish_reason == "stop"
    assert "<|im_end|>" not in (reply.choices[0].message.content or "")


def test_streamed_chat_equals_non_streamed_at_temperature_zero(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(
        model=MODEL, messages=HAIKU, temperature=0, max_tokens=48
    )
    texts, chunks = stream_chat(client, messages=HAIKU, temperature=0, max_tokens=48)
    assert "".join(texts) == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"  # type: ignore[attr-defined]
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason  # type: ignore[attr-defined]


def test_max_tokens_ends_with_length_and_exact_usage(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=HAIKU, temperature=0, max_tokens=5)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 5


def test_max_completion_tokens_is_honoured(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=HAIKU, temperature=0, max_completion_tokens=3
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 3


def test_stream_include_usage_sends_a_final_usage_chunk(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=HAIKU, temperature=0, max_tokens=7)
    _, chunks = stream_chat(
        client,
        messages=HAIKU,
        temperature=0,
        max_tokens=7,
        stream_options={"include_usage": True},
    )
    last = chunks[-1]
    assert last.choices == []  # type: ignore[attr-defined]
    assert last.usage == whole.usage  # type: ignore[attr-defined]


def test_stop_string_split_across_tokens_never_reaches_the_stream(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(
        model=MODEL, messages=HAIKU, temperature=0, max_tokens=20
    )
    text = whole.choices[0].message.content or ""
    assert text.startswith("The waves of")  # " waves" and " of" are two tokens
    texts, chunks = stream_chat(client, messages=HAIKU, temperature=0, stop=["aves o"])
    assert "".join(texts) == "The w"
    assert chunks[-1].choices[0].finish_reason == "stop"  # type: ignore[attr-defined]
    reply = client.chat.completions.create(
        model=MODEL, messages=HAIKU, temperature=0, stop="aves o"
    )
    assert reply.choices[0].message.content == "The w"
    assert reply.choices[0].finish_reason == "stop"


def test_same_seed_gives_same_sampled_text(client: openai.OpenAI) -> None:
    def sample() -> str:
        reply = client.chat.completions.create(
            model=MODEL, messages=HAIKU, temperature=1.0, top_p=0.9, seed=1234, max_tokens=24
        )
        return reply.choices[0].message.content or ""

    assert sample() == sample()


def test_content_as_a_list_of_text_parts(client: openai.OpenAI) -> None:
    parts = [
        {"type": "text", "text": "What is the capital"},
        {"type": "text", "text": " of France?"},
    ]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": parts}],  # type: ignore[list-item]
        temperature=0,
    )
    assert "Paris" in (reply.choices[0].message.content or "")


def test_text_completion_continues_the_prompt(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0
    )
    assert reply.object == "text_completion"
    assert reply.id.startswith("cmpl-")
    assert reply.choices[0].text.startswith(" Paris")
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 4


def test_text_completion_default_max_tokens_is_16(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt="Once upon a time", temperature=0)
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 16 or reply.choices[0].finish_reason == "stop"


def test_echo_prepends_the_prompt_streamed_or_not(client: openai.OpenAI) -> None:
    prompt = "The capital of France is"
    whole = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=4, temperature=0, echo=True
    )
    assert whole.choices[0].text.startswith(prompt + " Paris")
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=4, temperature=0, echo=True, stream=True
        )
    )
    assert chunks[0].choices[0].text == prompt
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text


def test_prompt_beyond_the_context_window_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="hello " * 9000, max_tokens=4)
    assert caught.value.code == "context_length_exceeded"


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert MODEL in [m.id for m in client.models.list().data]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_unknown_model_is_model_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=FRANCE)
    assert caught.value.code == "model_not_found"
