"""Plumbing of the engine loop, driven by the SYNTHETIC engines (no model) on the session's real
Redis: the events each job publishes, in order; admission while a batch runs; cancellation at
the next step, for a generation and an embedding job alike (one loop runs both); several
choices ending one by one. Each test has a namespace of its own."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from redis import Redis

from shared.queue.jobs import EmbeddingJob, GenerationJob, JobOutcome
from shared.queue.keys import Keys
from shared.wire.events import (
    AliveEvent,
    ChoiceEndEvent,
    DoneEvent,
    EmbeddingEvent,
    Event,
    StartedEvent,
    TokenEvent,
    decode_event,
    decode_frame,
    encode_event,
)
from worker.engine.doubles.synthetic import SyntheticEngine
from worker.engine.doubles.synthetic_embedding import SyntheticEmbeddingEngine
from worker.engine.embedding.engine import EmbeddingOutput, PreparedEmbedding
from worker.engine.generation.step_output import StepOutput
from worker.engine.prepare import PreparedJob
from worker.ops.cluster import wait_until
from worker.runtime.kinds.embedding_kind import EmbeddingKind
from worker.runtime.kinds.generation_kind import GenerationKind
from worker.runtime.loop import EngineLoop, Prepared
from worker.runtime.publish import EventSink, Route

STEP_S = 0.01


@pytest.fixture
def keys(redis: Redis) -> Iterator[Keys]:
    keys = Keys(f"looptest{secrets.token_hex(4)}")
    yield keys
    for key in redis.scan_iter(f"{keys.ns}:*"):
        redis.delete(key)


GenerationLoop = EngineLoop[PreparedJob, StepOutput]


@contextmanager
def looping(running: EngineLoop[Any, Any]) -> Iterator[None]:
    """`running` runs in a thread of its own, as in a worker's main thread, until the block ends."""
    stop = threading.Event()
    thread = threading.Thread(target=running.run, args=(stop,), daemon=True)
    thread.start()
    yield
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


def events(redis: Redis, keys: Keys, job_id: str) -> list[Event]:
    return [decode_event(row) for row in redis.lrange(keys.replay(job_id), 0, -1)]  # type: ignore[union-attr]


def after_two_steps(redis: Redis, keys: Keys, job_id: str) -> None:
    """Wait until the job has published its start and two steps' events."""
    wait_until(lambda: len(events(redis, keys, job_id)) >= 3, 5, f"two steps of job {job_id}")


@dataclass
class Generating:
    """A generation loop running on its synthetic engine, its jobs publishing under `keys`."""

    loop: GenerationLoop
    engine: SyntheticEngine
    redis: Redis
    keys: Keys

    def submit(self, job: GenerationJob) -> Future[JobOutcome]:
        """Hand `job` to the loop as a worker's slot would, its events kept in a replay log when
        the job asks for one (these tests read the log)."""
        route = Route.of(self.keys, job.job_id, job.reply_to, job.replayed)
        return self.loop.submit(self.engine.prepare(job), route)

    def events(self, job_id: str) -> list[Event]:
        return events(self.redis, self.keys, job_id)

    def after_two_steps(self, job_id: str) -> None:
        after_two_steps(self.redis, self.keys, job_id)


@pytest.fixture
def generation(redis: Redis, keys: Keys) -> Iterator[Generating]:
    engine = SyntheticEngine(STEP_S, default_max_tokens=16)
    running = EngineLoop(engine, GenerationKind(), EventSink(redis, replay_ttl_s=60))
    with looping(running):
        yield Generating(running, engine, redis, keys)


def test_a_job_publishes_started_then_its_tokens_then_one_done(generation: Generating) -> None:
    outcome = generation.submit(job("a", 5)).result(timeout=5)
    seen = generation.events("a")
    assert isinstance(seen[0], StartedEvent) and seen[0].prompt_tokens == 3
    assert [type(e) for e in seen[1:]] == [TokenEvent] * 5 + [DoneEvent]
    done = seen[-1]
    assert isinstance(done, DoneEvent) and done.finish_reason == "length"
    assert done.usage.completion_tokens == 5 and outcome.completion_tokens == 5


def test_a_running_job_is_said_alive_on_its_channel_and_never_in_its_replay_log(
    redis: Redis, keys: Keys
) -> None:
    engine = SyntheticEngine(STEP_S, default_max_tokens=16)
    running = EngineLoop(engine, GenerationKind(), EventSink(redis, 60), alive_s=0.05)
    listening = redis.pubsub()
    listening.subscribe(keys.events("a"))
    with looping(running):
        running.submit(engine.prepare(job("a", 40)), Route.of(keys, "a", None, True)).result(5)
    said = []
    while (message := listening.get_message(timeout=0.2)) is not None:
        if message["type"] == "message":
            said += [event for _, event in decode_frame(message["data"])]
    listening.close()
    alive = encode_event(AliveEvent())
    assert said.count(alive) >= 2  # 40 steps of 10 ms: one every 50 ms
    assert AliveEvent() not in events(redis, keys, "a")


def test_a_job_submitted_while_a_batch_runs_joins_it(generation: Generating) -> None:
    first = generation.submit(job("long", 60))
    generation.after_two_steps("long")
    second = generation.submit(job("short", 3))
    second.result(timeout=5)
    assert not first.done()  # the second came and went while the first ran on
    long_tokens = [e for e in generation.events("long") if isinstance(e, TokenEvent)]
    assert 0 < len(long_tokens) < 60
    first.result(timeout=5)


def test_a_cancelled_job_ends_at_the_next_step_and_publishes_nothing_more(
    generation: Generating,
) -> None:
    future = generation.submit(job("c", 10_000))
    generation.after_two_steps("c")
    generation.loop.cancel("c")
    outcome = future.result(timeout=2)
    assert outcome.finish_reason == "cancelled"
    count = len(generation.events("c"))
    turns = generation.loop.turns
    wait_until(lambda: generation.loop.turns >= turns + 2, 5, "two more turns of the loop")
    assert len(generation.events("c")) == count
    assert not generation.loop.busy


def test_a_job_with_several_choices_ends_each_then_the_job(generation: Generating) -> None:
    outcome = generation.submit(job("n", 4, n=3)).result(timeout=5)
    seen = generation.events("n")
    ends = [e for e in seen if isinstance(e, ChoiceEndEvent)]
    assert sorted(e.index for e in ends) == [0, 1, 2]
    assert isinstance(seen[-1], DoneEvent) and seen.index(ends[-1]) < len(seen) - 1
    tokens = [e for e in seen if isinstance(e, TokenEvent)]
    assert sorted({e.index or 0 for e in tokens}) == [0, 1, 2] and len(tokens) == 12
    assert outcome.completion_tokens == 12


def test_a_job_with_one_choice_publishes_no_choice_end(generation: Generating) -> None:
    generation.submit(job("one", 4)).result(timeout=5)
    assert not any(isinstance(e, ChoiceEndEvent) for e in generation.events("one"))


def test_plain_jobs_publish_on_their_api_process_channel_one_frame_per_step_and_leave_no_key(
    generation: Generating,
) -> None:
    redis, keys = generation.redis, generation.keys
    listener = redis.pubsub()
    listener.subscribe(keys.reply("api-1"))
    assert listener.get_message(timeout=1) is not None  # the subscription is confirmed
    plain = [
        job(name, 6).model_copy(update={"replay_ttl_s": None, "reply_to": "api-1"})
        for name in ("p1", "p2")
    ]
    assert not any(j.replayed for j in plain)
    for done in [generation.submit(j) for j in plain]:
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


# A loop of each kind on its synthetic engine, and a long job of that kind by id.
LongJobs = Callable[[EventSink], tuple[EngineLoop[Any, Any], Callable[[str], Prepared]]]


def long_generations(
    sink: EventSink,
) -> tuple[EngineLoop[PreparedJob, StepOutput], Callable[[str], PreparedJob]]:
    engine = SyntheticEngine(STEP_S, default_max_tokens=16)
    return EngineLoop(engine, GenerationKind(), sink), lambda i: engine.prepare(job(i, 10_000))


def long_embeddings(
    sink: EventSink,
) -> tuple[EngineLoop[PreparedEmbedding, EmbeddingOutput], Callable[[str], PreparedEmbedding]]:
    engine = SyntheticEmbeddingEngine(STEP_S)
    inputs: list[str | list[int]] = ["one input"] * 1000  # one vector a step

    def prepare(job_id: str) -> PreparedEmbedding:
        return engine.prepare(EmbeddingJob(job_id=job_id, model="e", inputs=inputs))

    return EngineLoop(engine, EmbeddingKind(), sink), prepare


@pytest.mark.parametrize(
    ("long_jobs", "step_event"),
    [(long_generations, TokenEvent), (long_embeddings, EmbeddingEvent)],
    ids=["generation", "embedding"],
)
def test_a_job_of_either_kind_is_cancelled_at_the_next_step_by_the_one_loop(
    long_jobs: LongJobs, step_event: type[Event], redis: Redis, keys: Keys
) -> None:
    """The cancelled job leaves the engine too: the job beside it goes on, and it does not."""
    running, prepare = long_jobs(EventSink(redis, replay_ttl_s=60))
    with looping(running):
        futures = {
            job_id: running.submit(prepare(job_id), Route.of(keys, job_id, None, replayed=True))
            for job_id in ("c", "kept")
        }
        after_two_steps(redis, keys, "c")
        running.cancel("c")
        outcome = futures["c"].result(timeout=2)
        count, kept = len(events(redis, keys, "c")), len(events(redis, keys, "kept"))
        wait_until(lambda: len(events(redis, keys, "kept")) >= kept + 3, 5, "three more steps")
        seen = events(redis, keys, "c")
        assert outcome.finish_reason == "cancelled" and outcome.prompt_tokens > 0
        assert len(seen) == count  # nothing more once cancelled
        assert isinstance(seen[0], StartedEvent)
        assert {type(e) for e in seen[1:]} == {step_event}  # no done, no error
        running.cancel("kept")
        assert futures["kept"].result(timeout=2).finish_reason == "cancelled"
        wait_until(lambda: not running.busy, 2, "the loop to hold no job")
