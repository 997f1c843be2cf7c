"""The worker's prefix cache, seen as OpenAI users see it: `usage.prompt_tokens_details`."""

from __future__ import annotations

import secrets

import openai

from tests.support import MODEL


def _system() -> dict[str, str]:
    # A system prompt no other test sends, so that only this test's requests can be cached.
    nonce = secrets.token_hex(4)
    text = f"You are assistant {nonce}. You answer in one short sentence, politely and clearly."
    return {"role": "system", "content": text}


def _cached(reply: object) -> int:
    usage = reply.usage  # type: ignore[attr-defined]
    assert usage is not None
    return int(usage.prompt_tokens_details.cached_tokens)


def test_a_repeated_greedy_request_is_served_from_the_cache_with_the_same_answer(
    client: openai.OpenAI,
) -> None:
    messages = [_system(), {"role": "user", "content": "Name a colour."}]
    first = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=12
    )
    again = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=12
    )
    assert again.usage is not None
    assert (
        _cached(first) < _cached(again) == again.usage.prompt_tokens - 1
    )  # the last token is recomputed
    assert again.choices[0].message.content == first.choices[0].message.content


def test_requests_sharing_a_system_prompt_reuse_it(client: openai.OpenAI) -> None:
    system = _system()
    first = client.chat.completions.create(
        model=MODEL,
        messages=[system, {"role": "user", "content": "Name a fruit."}],
        temperature=0,
        max_tokens=4,
    )
    other = client.chat.completions.create(
        model=MODEL,
        messages=[system, {"role": "user", "content": "Name a city."}],
        temperature=0,
        max_tokens=4,
    )
    assert other.usage is not None
    # Only the opening of the system prompt ("<|im_start|>system\nYou are assistant") is older.
    assert _cached(first) < 16 <= _cached(other) < other.usage.prompt_tokens


def test_the_next_turn_of_a_conversation_reuses_the_previous_turn(
    client: openai.OpenAI,
) -> None:
    turn = [_system(), {"role": "user", "content": "Say hello."}]
    first = client.chat.completions.create(model=MODEL, messages=turn, temperature=0)
    answer = first.choices[0].message.content or ""
    assert first.choices[0].finish_reason == "stop" and first.usage is not None
    follow_up = [*turn, {"role": "assistant", "content": answer}]
    follow_up.append({"role": "user", "content": "Now say goodbye."})
    second = client.chat.completions.create(
        model=MODEL, messages=follow_up, temperature=0, max_tokens=4
    )
    assert _cached(second) > first.usage.prompt_tokens
