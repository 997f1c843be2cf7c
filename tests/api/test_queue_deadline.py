"""A request's queue deadline (MLXQ_QUEUE_TIMEOUT_S) bounds its time in the queue: it counts
from the enqueue, not from when the API began the checks before it (api/queue/admission.py)."""

from __future__ import annotations

import time

import pytest
from redis import Redis
from redis.client import PubSub

from api import create_app
from api.queue.admission import admit
from api.queue.broker import Broker
from api.queue.context_window import PromptCount
from shared.queue.config import Settings
from shared.queue.jobs import GenerationJob, JobLimits, QueuedJob
from shared.queue.keys import Keys
from shared.wire.ids import new_id
from tests.support import MODEL, rq_queue

SLOW_S = 0.5


def test_a_jobs_queue_deadline_counts_from_its_enqueue(
    app_settings: Settings,
    redis: Redis,
    stand_in: tuple[Keys, PubSub],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys, _ = stand_in
    app = create_app(app_settings)
    broker: Broker = app.extensions["mlxq.broker"]
    checked: list[float] = []

    def slow_count(job: QueuedJob) -> PromptCount | None:
        """The prompt's count taking long, as a fresh API process's first one does."""
        time.sleep(SLOW_S)
        checked.append(time.time())
        return None

    monkeypatch.setattr(broker.windows, "measure", slow_count)
    job = GenerationJob(job_id=new_id("chatcmpl-"), model=MODEL, prompt="hi")
    with app.test_request_context():
        admitted = admit(broker, job, None)
        broker.enqueue(admitted.job, admitted.sub)
    broker.relay.unsubscribe(admitted.sub)

    (queued,) = rq_queue(redis, keys.queue(MODEL)).jobs
    limits = JobLimits.model_validate(queued.args[0]["limits"])
    assert limits.queue_deadline is not None
    assert limits.queue_deadline >= checked[0] + app_settings.queue_timeout_s
    assert limits.run_limit_s == app_settings.run_limit_s  # the other limits a client's job has
    assert queued.args[0] == admitted.job.model_dump(mode="json")  # queued as it was admitted
