"""Prompt plus max_tokens beyond the context window: a 400 from the API before anything is queued,
with the worker's exact numbers."""

from __future__ import annotations

import openai
import pytest
from redis import Redis
from rq.job import Job

from tests.support import MODEL

CONTEXT = 8192  # SmolLM2-135M-Instruct
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def rq_jobs(redis: Redis) -> set[bytes]:
    """The RQ jobs Redis holds now. Jobs of earlier tests may expire meanwhile, so a check that
    nothing was queued asks for no new ones, not for the same set."""
    return set(redis.scan_iter(Job.key_for("*"), count=1000))


def prompt_tokens(client: openai.OpenAI, **kwargs: object) -> int:
    reply = client.chat.completions.create(model=MODEL, max_tokens=1, **kwargs)  # type: ignore[call-overload]
    assert reply.usage is not None
    return int(reply.usage.prompt_tokens)


def test_a_prompt_beyond_the_window_is_refused_before_queueing(
    client: openai.OpenAI, redis: Redis
) -> None:
    before = rq_jobs(redis)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello " * 9000}]
        )
    assert caught.value.code == "context_length_exceeded"
    message = str(caught.value)
    assert f"maximum context length is {CONTEXT} tokens" in message
    assert "your messages resulted in 90" in message  # 9000 "hello"s and the template
    assert not rq_jobs(redis) - before


def test_max_tokens_that_does_not_fit_names_both_numbers(
    client: openai.OpenAI, redis: Redis
) -> None:
    prompt = prompt_tokens(client, messages=FRANCE)
    before = rq_jobs(redis)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=CONTEXT)
    assert caught.value.code == "context_length_exceeded"
    assert (
        f"you requested {prompt + CONTEXT} tokens ({prompt} in the messages, {CONTEXT} in the "
        "completion)" in str(caught.value)
    )
    assert not rq_jobs(redis) - before


def test_the_api_count_is_the_workers_to_the_token(client: openai.OpenAI) -> None:
    prompt = prompt_tokens(client, messages=FRANCE)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=MODEL, messages=FRANCE, max_tokens=CONTEXT - prompt + 1
        )
    stream = client.chat.completions.create(
        model=MODEL, messages=FRANCE, max_tokens=CONTEXT - prompt, stream=True
    )
    assert next(iter(stream)).choices[0].delta.role == "assistant"
    stream.close()  # the API cancels the job


def test_text_completion_prompt_counts_too(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=1)
    assert reply.usage is not None
    prompt = reply.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(
            model=MODEL, prompt="The capital of France is", max_tokens=CONTEXT - prompt + 1
        )
    assert f"({prompt} in the prompt, {CONTEXT - prompt + 1} in the completion)" in str(
        caught.value
    )


def test_a_developer_message_is_the_system_message_of_a_model_without_that_role(
    client: openai.OpenAI,
) -> None:
    def chat(role: str) -> list[dict[str, str]]:
        return [{"role": role, "content": "Answer briefly."}, FRANCE[0]]

    prompt = prompt_tokens(client, messages=chat("developer"))
    assert prompt == prompt_tokens(client, messages=chat("system"))
    assert prompt < prompt_tokens(client, messages=chat("user"))  # no default system prompt
    with pytest.raises(openai.BadRequestError) as caught:  # the API counts it the same way
        client.chat.completions.create(model=MODEL, messages=chat("developer"), max_tokens=CONTEXT)
    assert f"({prompt} in the messages, {CONTEXT} in the completion)" in str(caught.value)
    answer = client.responses.create(model=MODEL, input=chat("developer"), max_output_tokens=1)  # type: ignore[arg-type]
    assert answer.usage is not None and answer.usage.input_tokens == prompt
