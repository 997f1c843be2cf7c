"""A job past RQ's job timeout (MLXQ_JOB_TIMEOUT_S), on real parts: a worker's RQ slot
(worker/runtime/intake/slots.py) runs it through the job function (worker/runtime/job_function.py)
on a real engine loop driven by the SYNTHETIC engine (no model), over the session's Redis. RQ
raises its timeout in the slot thread; the job must leave the engine before RQ fails it (and
retries it), so a retry never runs beside its first copy."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from redis import Redis
from rq.job import Job, JobStatus

from shared.queue import backlog
from shared.queue.jobs import JOB_FUNCTION
from shared.queue.keys import Keys
from shared.wire.events import ErrorEvent, TokenEvent
from tests.support import flush_namespace, rq_queue
from tests.worker.test_loop import STEP_S, events, job, looping
from worker.engine.doubles.synthetic import SyntheticEngine
from worker.ops.cluster import wait_until
from worker.runtime.intake.slots import LEAVE_S, make_slots, start_slots, stop_slots
from worker.runtime.job_function import Runtime, bind
from worker.runtime.kinds.generation_kind import GenerationKind
from worker.runtime.publish import EventSink

JOB_TIMEOUT_S = 1  # RQ's timeout of the job, and the worker's: one setting on both sides


@pytest.fixture
def keys(redis: Redis) -> Iterator[Keys]:
    keys = Keys(f"timeouttest{secrets.token_hex(4)}")
    yield keys
    flush_namespace(redis, keys.ns)


def test_a_job_past_its_job_timeout_leaves_the_engine_before_rq_fails_it(
    redis: Redis, keys: Keys
) -> None:
    engine = SyntheticEngine(STEP_S, default_max_tokens=16)
    sink = EventSink(redis, replay_ttl_s=60)
    release = redis.register_script(backlog.RELEASE)
    worker_id = f"{keys.ns}.1"
    rt = Runtime.start(
        GenerationKind(), engine, sink, redis, keys, JOB_TIMEOUT_S, release, worker_id
    )
    slots = make_slots(redis, keys, "m", worker_id, count=1, interactive=0)
    when_rq_heard: list[tuple[bool, int]] = []  # (the loop still holds a job, events logged)

    def on_failure(failed: Job, *exc_info: Any) -> bool:
        when_rq_heard.append((rt.loop.busy, len(events(redis, keys, failed.id))))
        return True

    slots[0].push_exc_handler(on_failure)
    endless = job("endless", 100_000)  # far longer than its timeout: only the timeout ends it
    queued = rq_queue(redis, keys.batch_queue("m")).enqueue_call(
        JOB_FUNCTION,
        args=(endless.model_dump(mode="json"),),
        job_id=endless.job_id,
        timeout=JOB_TIMEOUT_S,
    )
    bind(rt)
    with looping(rt.loop):
        start_slots(slots)
        try:
            wait_until(lambda: when_rq_heard, JOB_TIMEOUT_S + 10, "RQ to hear of the timeout")
            wait_until(lambda: queued.get_status() == JobStatus.FAILED, 5, "RQ to fail the job")
            turns = rt.loop.turns
            wait_until(lambda: rt.loop.turns >= turns + 2, 5, "two more turns of the loop")
        finally:
            stop_slots(slots, wait_s=LEAVE_S)
    [(busy, logged)] = when_rq_heard
    seen = events(redis, keys, endless.job_id)
    assert not busy, "RQ heard of the timeout while the job still ran in the engine"
    assert len(seen) == logged and isinstance(seen[-1], ErrorEvent)  # nothing after its end
    assert sum(isinstance(e, TokenEvent) for e in seen) > 10  # it did run until its timeout
