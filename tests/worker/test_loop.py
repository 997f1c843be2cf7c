"""Plumbing of the engine loop, driven by the SYNTHETIC engine (no model) on the session's real
Redis: the events each job publishes, in order; admission while a batch runs; cancellation at
the next step; several choices ending one by one. Each test has a namespace of its own."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pytest
from redis import Redis

from shared.queue.jobs import GenerationJob, JobOutcome
from shared.queue.keys import Keys
from shared.wire.events import (
    ChoiceEndEvent,
    DoneEvent,
    Event,
    StartedEvent,
    TokenEvent,
    decode_event,
    decode_frame,
)
from worker.engine.doubles.synthetic import SyntheticEngine
from worker.runtime.loop import EngineLoop
from worker.runtime.publish import EventSink, Route

STEP_S = 0.01


@pytest.fixture
def keys(redis: Redis) -> Iterator[Keys]:
    keys = Keys(f"looptest{secrets.token_hex(4)}")
    yield keys
    for key in redis.scan_iter(f"{keys.ns}:*"):
        redis.delete(key)


@pytest.fixture
def loop(redis: Redis, keys: Keys) -> Iterator[tuple[EngineLoop, SyntheticEngine]]:
    engine = SyntheticEngine(STEP_S, default_max_tokens=16)
    running = EngineLoop(engine, EventSink(redis, replay_ttl_s=60), keys)
    stop = threading.Event()
    thread = threading.Thread(target=running.run, args=(stop,), daemon=True)
    thread.start()
    yield running, engine
    stop.set()
    thread.join(timeout=5)


def job(job_id: str, max_tokens: int, **extra: Any) -> GenerationJob:
    """A job that keeps a replay log, as a stored response does."""
    return GenerationJob(
        job_id=job_id,
        model="m",
        prompt="one two three",
        max_tokens=max_tokens,
        replay_ttl_s=60,
        **extra,
    )


def submit(
    running: EngineLoop, engine: SyntheticEngine, keys: Keys, job: GenerationJob
) -> Future[JobOutcome]:
    """Hand `job` to the loop as a worker's slot would, its events kept in a replay log when
    the job asks for one (these tests read the log)."""
    return running.submit(
        engine.prepare(job), Route.of(keys, job.job_id, job.reply_to, job.replayed)
    )


def events(redis: Redis, keys: Keys, job_id: str) -> list[Event]:
    return [decode_event(row) for row in redis.lrange(keys.replay(job_id), 0, -1)]  # type: ignore[union-attr]


def test_a_job_publishes_started_then_its_tokens_then_one_done(
    loop: tuple[EngineLoop, SyntheticEngine], redis: Redis, keys: Keys
) -> None:
    running, engine = loop
    outcome = submit(running, engine, keys, job("a", 5)).result(timeout=5)
    seen = events(redis, keys, "a")
    assert isinstance(seen[0], StartedEvent) and seen[0].prompt_tokens == 3
    assert [type(e) for e in seen[1:]] == [TokenEvent] * 5 + [DoneEvent]
    done = seen[-1]
    assert isinstance(done, DoneEvent) and done.finish_reason == "length"
    assert done.usage.completion_tokens == 5 and outcome.completion_tokens == 5


def test_a_job_submitted_while_a_batch_runs_joins_it(
    loop: tuple[EngineLoop, SyntheticEngine], redis: Redis, keys: Keys
) -> None:
    running, engine = loop
    first = submit(running, engine, keys, job("long", 60))
    time.sleep(10 * STEP_S)
    second = submit(running, engine, keys, job("short", 3))
    second.result(timeout=5)
    assert not first.done()  # the second came and went while the first ran on
    long_tokens = [e for e in events(redis, keys, "long") if isinstance(e, TokenEvent)]
    assert 0 < len(long_tokens) < 60
    first.result(timeout=5)


def test_a_cancelled_job_ends_at_the_next_step_and_publishes_nothing_more(
    loop: tuple[EngineLoop, SyntheticEngine], redis: Redis, keys: Keys
) -> None:
    running, engine = loop
    future = submit(running, engine, keys, job("c", 10_000))
    time.sleep(5 * STEP_S)
    running.cancel("c")
    outcome = future.result(timeout=2)
    assert outcome.finish_reason == "cancelled"
    count = len(events(redis, keys, "c"))
    time.sleep(5 * STEP_S)
    assert len(events(redis, keys, "c")) == count
    assert not running.busy


def test_a_job_with_several_choices_ends_each_then_the_job(
    loop: tuple[EngineLoop, SyntheticEngine], redis: Redis, keys: Keys
) -> None:
    running, engine = loop
    outcome = submit(running, engine, keys, job("n", 4, n=3)).result(timeout=5)
    seen = events(redis, keys, "n")
    ends = [e for e in seen if isinstance(e, ChoiceEndEvent)]
    assert sorted(e.index for e in ends) == [0, 1, 2]
    assert isinstance(seen[-1], DoneEvent) and seen.index(ends[-1]) < len(seen) - 1
    tokens = [e for e in seen if isinstance(e, TokenEvent)]
    assert sorted({e.index or 0 for e in tokens}) == [0, 1, 2] and len(tokens) == 12
    assert outcome.completion_tokens == 12


def test_a_job_with_one_choice_publishes_no_choice_end(
    loop: tuple[EngineLoop, SyntheticEngine], redis: Redis, keys: Keys
) -> None:
    running, engine = loop
    submit(running, engine, keys, job("one", 4)).result(timeout=5)
    assert not any(isinstance(e, ChoiceEndEvent) for e in events(redis, keys, "one"))


def test_plain_jobs_publish_on_their_api_process_channel_one_frame_per_step_and_leave_no_key(
    loop: tuple[EngineLoop, SyntheticEngine], redis: Redis, keys: Keys
) -> None:
    running, engine = loop
    listener = redis.pubsub()
    listener.subscribe(keys.reply("api-1"))
    assert listener.get_message(timeout=1) is not None  # the subscription is confirmed
    plain = [
        job(name, 6).model_copy(update={"replay_ttl_s": None, "reply_to": "api-1"})
        for name in ("p1", "p2")
    ]
    assert not any(j.replayed for j in plain)
    for done in [submit(running, engine, keys, j) for j in plain]:
        done.result(timeout=5)
    heard: dict[str, list[Event]] = {"p1": [], "p2": []}
    messages = 0
    while (message := listener.get_message(timeout=0.5)) is not None:
        messages += 1
        for job_id, data in decode_frame(message["data"]):
            heard[job_id].append(decode_event(data))
    listener.close()
    for events_of_one in heard.values():
        assert [type(e) for e in events_of_one] == [StartedEvent] + [TokenEvent] * 6 + [DoneEvent]
    assert messages < 16  # steps that ran both jobs sent one message for the two
    assert list(redis.scan_iter(f"{keys.ns}:*")) == []
