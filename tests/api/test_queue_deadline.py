"""A request's queue deadline (MLXQ_QUEUE_TIMEOUT_S) bounds its time in the queue: it counts
from the enqueue, not from when the API began the checks before it (api/queue/broker.py)."""

from __future__ import annotations

import time

from redis import Redis
from redis.client import PubSub

from api.queue.broker import Broker
from shared.queue.config import Settings
from shared.queue.jobs import GenerationJob, JobLimits
from shared.queue.keys import Keys
from shared.wire.ids import new_id
from tests.support import MODEL, rq_queue


def test_a_jobs_queue_deadline_counts_from_its_enqueue(
    app_settings: Settings, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    keys, _ = stand_in
    broker = Broker(app_settings)
    # Stamped as a request's limits are when the API starts on it, its checks then taking long.
    stamped = broker.interactive_limits().model_copy(update={"queue_deadline": time.time() - 5})
    job = GenerationJob(job_id=new_id("chatcmpl-"), model=MODEL, prompt="hi", limits=stamped)
    before = time.time()
    broker.relay.unsubscribe(broker.submit(job))

    (queued,) = rq_queue(redis, keys.queue(MODEL)).jobs
    limits = JobLimits.model_validate(queued.args[0]["limits"])
    assert limits.queue_deadline is not None
    assert limits.queue_deadline >= before + app_settings.queue_timeout_s
    assert limits.run_limit_s == stamped.run_limit_s  # the other limits as they were
