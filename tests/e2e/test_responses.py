"""The Responses API through the OpenAI SDK: sync, streamed, background, resumed, cancelled."""

from __future__ import annotations

import urllib.request

import openai
import pytest
from redis import Redis

from shared.observe.metrics import JobRecord
from shared.queue.config import Settings
from tests.support import MODEL, finished, poll, recent_jobs
from worker.ops.cluster import wait_until

FRANCE = "What is the capital of France?"
STORY = "Write a long story about a dragon who learns to bake bread."


def test_sync_response_answers_with_output_text_and_usage(client: openai.OpenAI) -> None:
    reply = client.responses.create(model=MODEL, input=FRANCE, temperature=0)
    assert reply.status == "completed"
    assert reply.id.startswith("resp_")
    assert "Paris" in reply.output_text
    assert reply.usage is not None and reply.usage.input_tokens > 0
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": FRANCE}], temperature=0
    )
    assert reply.output_text == chat.choices[0].message.content
    assert client.responses.retrieve(reply.id).output_text == reply.output_text


def test_instructions_and_max_output_tokens(client: openai.OpenAI) -> None:
    reply = client.responses.create(
        model=MODEL,
        instructions="You are a pirate.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Hello!"}]}],
        max_output_tokens=5,
        temperature=0,
        metadata={"k": "v"},
    )
    assert reply.status == "incomplete"
    assert reply.incomplete_details is not None
    assert reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage is not None and reply.usage.output_tokens == 5
    assert (reply.instructions, reply.metadata) == ("You are a pirate.", {"k": "v"})


def test_streamed_response_is_numbered_and_equals_the_sync_text(client: openai.OpenAI) -> None:
    whole = client.responses.create(model=MODEL, input=FRANCE, temperature=0)
    events = list(client.responses.create(model=MODEL, input=FRANCE, temperature=0, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    assert events[-1].response.output_text == whole.output_text  # type: ignore[union-attr]


def test_background_response_polled_to_completion(client: openai.OpenAI) -> None:
    whole = client.responses.create(model=MODEL, input=FRANCE, temperature=0)
    started = client.responses.create(model=MODEL, input=FRANCE, temperature=0, background=True)
    assert started.status in ("queued", "in_progress")
    assert started.background is True
    done = poll(client, started.id, finished, 60)
    assert done.status == "completed"
    assert done.output_text == whole.output_text


def test_background_response_streamed_from_creation(client: openai.OpenAI) -> None:
    whole = client.responses.create(model=MODEL, input=FRANCE, temperature=0)
    events = list(
        client.responses.create(
            model=MODEL, input=FRANCE, temperature=0, background=True, stream=True
        )
    )
    assert [e.type for e in events[:2]] == ["response.created", "response.queued"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == whole.output_text  # type: ignore[union-attr]


def test_resumed_stream_equals_the_uninterrupted_one(client: openai.OpenAI, api_url: str) -> None:
    started = client.responses.create(
        model=MODEL, input=STORY, temperature=0, max_output_tokens=40, background=True
    )
    full = list(client.responses.retrieve(started.id, stream=True))
    assert full[-1].type == "response.incomplete"
    text = "".join(e.delta for e in full if e.type == "response.output_text.delta")
    for after in (0, 5, len(full) // 2):
        resumed = list(client.responses.retrieve(started.id, stream=True, starting_after=after))
        assert [e.model_dump() for e in resumed] == [e.model_dump() for e in full[after + 1 :]]
    raw = urllib.request.Request(
        f"{api_url}/v1/responses/{started.id}?stream=true", headers={"Last-Event-ID": "5"}
    )
    with urllib.request.urlopen(raw, timeout=60) as answer:
        first_frame = answer.read().decode().split("\n\n")[0]
    assert first_frame.startswith("id: 6\nevent: ")
    head = [e for e in full if e.sequence_number <= 10]
    tail = list(client.responses.retrieve(started.id, stream=True, starting_after=10))
    joined = "".join(e.delta for e in [*head, *tail] if e.type == "response.output_text.delta")
    assert joined == text


def test_resuming_while_it_runs_follows_it_live(client: openai.OpenAI) -> None:
    started = client.responses.create(
        model=MODEL, input=STORY, temperature=0, max_output_tokens=60, background=True
    )
    first = poll(client, started.id, lambda r: len(r.output_text) > 0, 60)
    assert first.status in ("in_progress", "incomplete")
    live = list(client.responses.retrieve(started.id, stream=True, starting_after=3))
    assert live[0].sequence_number == 4
    assert live[-1].type == "response.incomplete"
    final = client.responses.retrieve(started.id)
    deltas = "".join(e.delta for e in live if e.type == "response.output_text.delta")
    assert deltas == final.output_text


def test_cancel_while_running_stops_it_and_stays_cancelled(
    client: openai.OpenAI, settings: Settings, redis: Redis
) -> None:
    started = client.responses.create(
        model=MODEL, input=STORY, temperature=0.7, max_output_tokens=2000, background=True
    )
    poll(client, started.id, lambda r: len(r.output_text) > 0, 60)
    cancelled = client.responses.cancel(started.id)
    assert cancelled.status == "cancelled"
    text = cancelled.output_text

    def ended() -> JobRecord | None:  # the worker's record of the job, once it has ended it
        return next((j for j in recent_jobs(redis, settings) if j.job_id == started.id), None)

    # Ended by the cancel: at once, where its 2,000 tokens would take minutes.
    wait_until(ended, 30, "the worker to end the cancelled job")
    record = ended()
    assert record is not None and record.finish_reason == "cancelled"
    later = client.responses.retrieve(started.id)
    assert later.status == "cancelled"
    assert len(later.output_text) <= len(text) + 200  # at most a step or two landed after
    assert client.responses.cancel(started.id).status == "cancelled"  # idempotent


def test_cancel_while_queued_takes_it_off_the_queue(client: openai.OpenAI) -> None:
    # Fill every bulk slot of the worker (8 slots, 2 kept for interactive jobs) and then some.
    blockers = [
        client.responses.create(
            model=MODEL, input=STORY, max_output_tokens=2000, background=True
        ).id
        for _ in range(8)
    ]
    try:
        queued = client.responses.retrieve(blockers[-1])
        assert queued.status == "queued"
        assert queued.model_extra is not None and queued.model_extra["queue_position"] >= 0
        cancelled = client.responses.cancel(blockers[-1])
        assert cancelled.status == "cancelled" and cancelled.output == []
        assert client.responses.retrieve(blockers[-1]).status == "cancelled"
    finally:
        for response_id in blockers:
            client.responses.cancel(response_id)
    # The slots are free again: an interactive request is answered at once.
    reply = client.responses.create(model=MODEL, input=FRANCE, temperature=0)
    assert "Paris" in reply.output_text


def test_delete_then_404(client: openai.OpenAI) -> None:
    reply = client.responses.create(model=MODEL, input=FRANCE, max_output_tokens=4)
    client.responses.delete(reply.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)


def test_not_stored_responses_cannot_be_retrieved(client: openai.OpenAI) -> None:
    reply = client.responses.create(model=MODEL, input=FRANCE, max_output_tokens=4, store=False)
    assert reply.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)


def test_unknown_model_is_a_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="hi", background=True)
