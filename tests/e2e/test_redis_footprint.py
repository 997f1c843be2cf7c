"""What a request leaves in Redis once it ends, on the real stack: a plain completion, streamed
or not, leaves no per-token key (its events go over pub/sub only); a stored response keeps its
event log as long as its record (from the job's end rather than the record's creation)."""

from __future__ import annotations

import time

import openai
from redis import Redis

from shared.queue.config import Settings
from shared.queue.keys import Keys
from tests.support import MODEL

HI = [{"role": "user", "content": "Say hello."}]


def test_plain_completions_leave_no_event_log_behind(
    client: openai.OpenAI, redis: Redis, settings: Settings
) -> None:
    keys = Keys(settings.namespace)
    ids = [client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4).id]  # type: ignore[arg-type]
    stream = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, stream=True)  # type: ignore[arg-type]
    ids += list({chunk.id for chunk in stream})
    ids.append(client.completions.create(model=MODEL, prompt="Once", max_tokens=4).id)
    assert len(ids) == 3
    assert [redis.exists(keys.replay(i)) for i in ids] == [0, 0, 0]


def test_a_stored_response_keeps_its_event_log_as_long_as_its_record(
    client: openai.OpenAI, redis: Redis, settings: Settings
) -> None:
    keys = Keys(settings.namespace)
    started = time.monotonic()
    stored = client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=4)
    took_s = time.monotonic() - started
    assert redis.llen(keys.replay(stored.id)) > 0
    log_ttl, record_ttl = redis.ttl(keys.replay(stored.id)), redis.ttl(keys.response(stored.id))
    # The record's TTL runs from its creation, the log's from the job's end: never less.
    assert record_ttl > 0 and record_ttl <= log_ttl <= record_ttl + took_s + 1
    unstored = client.responses.create(
        model=MODEL, input="Say hello.", max_output_tokens=4, store=False
    )
    assert not redis.exists(keys.replay(unstored.id))
