"""OpenAI parity on the real model through the OpenAI SDK: structured outputs, log
probabilities and the sampling parameters, streamed and not, on every queue path."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field
from tokenizers import Tokenizer

from shared.queue.config import Settings
from tests.support import MODEL, chat_line, finished, lines_of, poll, start_batch, wait_batch

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
PERSON = [{"role": "user", "content": "Describe a person called Ada as JSON."}]
PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "likes_tea": {"type": "boolean"},
    },
    "required": ["name", "age", "likes_tea"],
    "additionalProperties": False,
}
PERSON_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True},
}
# PERSON as a greedy Responses request (its text format is the test's).
PERSON_RESPONSE: dict[str, Any] = {
    "model": MODEL,
    "input": PERSON[0]["content"],
    "temperature": 0,
    "max_output_tokens": 80,
}


class Person(BaseModel):
    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=150)


def test_json_object_output_always_parses_as_an_object(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=FRANCE,
        temperature=0.8,
        seed=3,
        max_tokens=80,
        response_format={"type": "json_object"},
    )
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)


def test_json_schema_output_validates_streamed_and_not(client: openai.OpenAI) -> None:
    args: dict[str, Any] = dict(
        model=MODEL, messages=PERSON, temperature=0, max_tokens=80, response_format=PERSON_FORMAT
    )
    whole = client.chat.completions.create(**args)
    text = whole.choices[0].message.content or ""
    jsonschema.validate(json.loads(text), PERSON_SCHEMA)
    chunks = list(client.chat.completions.create(stream=True, **args))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_parse_with_a_pydantic_model_returns_parsed(client: openai.OpenAI) -> None:
    reply = client.chat.completions.parse(
        model=MODEL, messages=PERSON, temperature=0, max_tokens=60, response_format=Person
    )
    parsed = reply.choices[0].message.parsed
    assert isinstance(parsed, Person)
    assert 0 <= parsed.age <= 150


def test_responses_text_format_constrains_the_output(client: openai.OpenAI) -> None:
    response = client.responses.create(
        **PERSON_RESPONSE,
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON_SCHEMA}},
    )
    jsonschema.validate(json.loads(response.output_text), PERSON_SCHEMA)
    assert response.text.format.type == "json_schema"  # type: ignore[union-attr]


def test_background_response_carries_its_text_format(client: openai.OpenAI) -> None:
    started = client.responses.create(
        **PERSON_RESPONSE, background=True, text={"format": {"type": "json_object"}}
    )
    done = poll(client, started.id, finished, 60)
    assert done.status == "completed"
    assert isinstance(json.loads(done.output_text), dict)


def test_batch_lines_carry_response_format_and_logprobs(client: openai.OpenAI) -> None:
    lines = [
        chat_line(
            "schema",
            PERSON[0]["content"],
            temperature=0,
            max_tokens=80,
            response_format=PERSON_FORMAT,
        ),
        chat_line("lp", FRANCE[0]["content"], temperature=0, max_tokens=8, logprobs=True),
    ]
    batch = wait_batch(client, start_batch(client, lines).id)
    assert batch.status == "completed"
    bodies = {o["custom_id"]: o["response"]["body"] for o in lines_of(client, batch.output_file_id)}
    content = bodies["schema"]["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(content), PERSON_SCHEMA)
    entries = bodies["lp"]["choices"][0]["logprobs"]["content"]
    assert "".join(e["token"] for e in entries) == bodies["lp"]["choices"][0]["message"]["content"]


def test_a_constrained_sequence_shares_the_batch_with_plain_ones(client: openai.OpenAI) -> None:

    def run(extra: dict[str, Any]) -> list[float]:
        stream = client.chat.completions.create(
            model=MODEL, messages=PERSON, temperature=0, max_tokens=40, stream=True, **extra
        )
        return [time.monotonic() for c in stream if c.choices and c.choices[0].delta.content]

    with ThreadPoolExecutor(3) as pool:  # an error in any request is raised here
        constrained, *plain = pool.map(run, [{"response_format": PERSON_FORMAT}, {}, {}])
    assert constrained and all(plain)
    for arrivals in plain:
        # Tokens of each stream arrive while the other is still producing: one running batch.
        assert constrained[0] < arrivals[-1] and arrivals[0] < constrained[-1]


def test_chat_logprobs_name_decoded_tokens_with_bytes_and_alternatives(
    client: openai.OpenAI,
) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=FRANCE, temperature=0, max_tokens=12, logprobs=True, top_logprobs=3
    )
    choice = reply.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    entries = choice.logprobs.content
    assert "".join(e.token for e in entries) == choice.message.content
    for e in entries:
        assert "Ġ" not in e.token
        assert e.bytes == list(e.token.encode())
        assert e.logprob <= 0
        assert len(e.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert e.top_logprobs[0].token == e.token
        assert e.top_logprobs[0].logprob == pytest.approx(e.logprob, abs=1e-4)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=FRANCE,
        temperature=0,
        max_tokens=12,
        logprobs=True,
        top_logprobs=3,
        stream=True,
    )
    streamed = [
        e
        for c in stream
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content or []
    ]
    assert [e.token for e in streamed] == [e.token for e in entries]


def test_chat_without_logprobs_returns_none(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=FRANCE, temperature=0, max_tokens=4
    )
    assert reply.choices[0].logprobs is None


def test_completions_logprobs_are_the_legacy_shape(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=6, logprobs=2
    )
    choice = reply.choices[0]
    assert choice.logprobs is not None
    tokens = choice.logprobs.tokens or []
    assert "".join(tokens) == choice.text
    assert len(choice.logprobs.token_logprobs or []) == len(tokens)
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs or [])
    offsets = choice.logprobs.text_offset or []
    assert offsets[0] == 0 and offsets == sorted(offsets)


def _token_id(text: str) -> int:
    tokenizer = Tokenizer.from_file(str(Settings().models_dir / MODEL / "tokenizer.json"))
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
    assert len(ids) == 1
    return ids[0]


def test_logit_bias_forces_and_forbids_tokens(client: openai.OpenAI) -> None:
    forced = client.completions.create(
        model=MODEL,
        prompt="Once upon a time",
        temperature=0,
        max_tokens=4,
        logit_bias={str(_token_id(" banana")): 100},
    )
    assert forced.choices[0].text == " banana" * 4
    plain = client.chat.completions.create(
        model=MODEL, messages=FRANCE, temperature=0, max_tokens=8
    )
    first = (plain.choices[0].message.content or "").split()[0]
    banned = client.chat.completions.create(
        model=MODEL,
        messages=FRANCE,
        temperature=0,
        max_tokens=8,
        logit_bias={str(_token_id(first)): -100},
    )
    assert not (banned.choices[0].message.content or "").startswith(first)


def test_a_token_outside_the_vocabulary_in_logit_bias_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=FRANCE, max_tokens=2, logit_bias={"999999": 1}
        )
    assert caught.value.body["param"] == "logit_bias"  # type: ignore[index]


def test_penalties_change_a_greedy_answer(client: openai.OpenAI) -> None:
    story = [{"role": "user", "content": "Repeat the word 'cat' many times."}]
    args: dict[str, Any] = dict(model=MODEL, messages=story, temperature=0, max_tokens=24)
    plain = client.chat.completions.create(**args).choices[0].message.content
    penalties: list[dict[str, Any]] = [
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"extra_body": {"repetition_penalty": 2.0}},
    ]
    for penalty in penalties:
        penalised = client.chat.completions.create(**args, **penalty).choices[0].message.content
        assert penalised != plain, penalty


def test_top_k_one_samples_the_greedy_answer(client: openai.OpenAI) -> None:
    greedy = client.chat.completions.create(
        model=MODEL, messages=FRANCE, temperature=0, max_tokens=10
    )
    top1 = client.chat.completions.create(
        model=MODEL, messages=FRANCE, temperature=1.5, max_tokens=10, extra_body={"top_k": 1}
    )
    assert top1.choices[0].message.content == greedy.choices[0].message.content


def test_the_same_seed_gives_the_same_output_in_the_batch(client: openai.OpenAI) -> None:
    args: dict[str, Any] = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a short poem about rain."}],
        temperature=1.0,
        seed=1234,
        max_tokens=20,
        presence_penalty=0.5,
        extra_body={"min_p": 0.05, "top_k": 50},
    )

    def run(_: int) -> str:
        return client.chat.completions.create(**args).choices[0].message.content or ""

    with ThreadPoolExecutor(3) as pool:
        texts = list(pool.map(run, range(3)))  # an error in any request is raised here
    assert len(texts) == 3 and texts[0] and len(set(texts)) == 1


def test_service_tier_is_echoed(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=FRANCE, max_tokens=2, service_tier="default", store=True
    )
    assert reply.service_tier == "default"


LEAVES = st.sampled_from(
    [
        {"type": "integer", "minimum": -50, "maximum": 50},
        {"type": "boolean"},
        {"type": "string", "maxLength": 8},
        {"type": "string", "enum": ["red", "green", "blue"]},
        {"type": "null"},
        {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3},
    ]
)
NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)


@st.composite
def small_schemas(draw: st.DrawFn) -> dict[str, Any]:
    properties = draw(st.dictionaries(NAMES, LEAVES, min_size=1, max_size=3))
    required = draw(st.lists(st.sampled_from(sorted(properties)), unique=True))
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


# Derandomized (with the request's seed, each example's answer is fixed): CI needs no luck.
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(schema=small_schemas(), seed=st.integers(0, 2**31))
def test_constrained_output_validates_against_random_small_schemas(
    client: openai.OpenAI, schema: dict[str, Any], seed: int
) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=PERSON,
        temperature=1.0,
        seed=seed,
        max_tokens=120,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    )
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content or ""), schema)


def test_n_choices_have_their_own_indexes_and_count_the_prompt_once(
    client: openai.OpenAI,
) -> None:
    args: dict[str, Any] = dict(
        model=MODEL, messages=FRANCE, temperature=1.0, seed=9, max_tokens=12
    )
    one = client.chat.completions.create(**args)
    three = client.chat.completions.create(n=3, **args)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert len({c.message.content for c in three.choices}) > 1  # each choice draws its own
    assert three.choices[0].message.content == one.choices[0].message.content
    assert three.usage is not None and one.usage is not None
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens > one.usage.completion_tokens


def test_n_choices_stream_with_their_index_and_each_ends(client: openai.OpenAI) -> None:
    args: dict[str, Any] = dict(
        model=MODEL, messages=FRANCE, temperature=1.0, seed=4, max_tokens=10, n=2
    )
    whole = client.chat.completions.create(**args)
    texts: dict[int, str] = {0: "", 1: ""}
    endings: dict[int, str | None] = {}
    for chunk in client.chat.completions.create(stream=True, **args):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason is not None:
                endings[choice.index] = choice.finish_reason
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert endings == {c.index: c.finish_reason for c in whole.choices}


def test_completions_n_with_logprobs(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=MODEL, prompt="The sea is", temperature=1.0, seed=2, max_tokens=5, n=2, logprobs=1
    )
    assert [c.index for c in reply.choices] == [0, 1]
    for choice in reply.choices:
        assert choice.logprobs is not None
        assert "".join(choice.logprobs.tokens or []) == choice.text


def test_a_list_of_prompts_gives_n_choices_each_in_openais_order(client: openai.OpenAI) -> None:
    prompts = ["The capital of France is", "The capital of Italy is"]
    whole = client.completions.create(model=MODEL, prompt=prompts, temperature=0, max_tokens=4, n=2)
    singles = [
        client.completions.create(model=MODEL, prompt=p, temperature=0, max_tokens=4).choices[0]
        for p in prompts
    ]
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    assert [c.text for c in whole.choices] == [s.text for s in singles for _ in range(2)]


def test_a_prompt_of_token_ids_continues_those_tokens(client: openai.OpenAI) -> None:
    text = "The capital of France is"
    tokenizer = Tokenizer.from_file(str(Settings().models_dir / MODEL / "tokenizer.json"))
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    by_text = client.completions.create(model=MODEL, prompt=text, temperature=0, max_tokens=5)
    by_ids = client.completions.create(model=MODEL, prompt=ids, temperature=0, max_tokens=5)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage == by_text.usage


def test_echo_with_logprobs_and_no_tokens_scores_the_prompt(client: openai.OpenAI) -> None:
    prompt = "The capital of France is Paris"
    scored = client.completions.create(
        model=MODEL, prompt=prompt, echo=True, logprobs=1, max_tokens=0
    )
    choice = scored.choices[0]
    assert choice.text == prompt
    assert choice.logprobs is not None
    assert "".join(choice.logprobs.tokens or []) == prompt
    values = choice.logprobs.token_logprobs or []
    assert values[0] is None and all(v is not None and v <= 0 for v in values[1:])
    assert scored.usage is not None and scored.usage.completion_tokens == 0
    # The likelier continuation scores higher: what eval harnesses rank answers by.
    wrong = client.completions.create(
        model=MODEL, prompt="The capital of France is Rome", echo=True, logprobs=0, max_tokens=0
    )
    wrong_values = wrong.choices[0].logprobs.token_logprobs or []  # type: ignore[union-attr]
    assert values[-1] > wrong_values[-1]  # type: ignore[operator]


def test_echo_with_logprobs_then_generation_lists_prompt_then_answer(
    client: openai.OpenAI,
) -> None:
    prompt = "The capital of France is"
    reply = client.completions.create(
        model=MODEL, prompt=prompt, echo=True, logprobs=0, max_tokens=3, temperature=0
    )
    choice = reply.choices[0]
    assert choice.logprobs is not None
    assert "".join(choice.logprobs.tokens or []) == choice.text
    assert choice.text.startswith(prompt) and len(choice.text) > len(prompt)
    offsets = choice.logprobs.text_offset or []
    assert offsets[0] == 0 and offsets == sorted(offsets)
