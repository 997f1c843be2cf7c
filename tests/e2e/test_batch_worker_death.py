"""A worker killed mid-batch loses nothing: its lines run again on a live worker, once each."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import openai
from redis import Redis
from rq.job import Job
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

from shared.queue.config import Settings
from shared.queue.keys import Keys
from tests.support import MODEL, lines_of, start_batch, wait_batch
from worker.ops.cluster import Cluster, wait_until

SLOTS = 4


def _finished(job: Job) -> bool:
    return job.get_status(refresh=True) == "finished"


def running_on(redis: Redis, settings: Settings, worker_id: str) -> list[str]:
    registry = StartedJobRegistry(
        Keys(settings.namespace).batch_queue(MODEL), connection=redis, serializer=JSONSerializer
    )
    found = []
    for job_id in registry.get_job_ids(cleanup=False):
        job = Job.fetch(job_id, connection=redis, serializer=JSONSerializer)
        if (job.worker_name or "").startswith(worker_id + "."):
            found.append(job_id)
    return found


def test_a_worker_killed_mid_batch_loses_nothing_and_doubles_nothing(
    client: openai.OpenAI, settings: Settings, redis: Redis, stack: Cluster
) -> None:
    doomed = stack.start_worker(MLXQ_BATCH_SIZE=str(SLOTS), MLXQ_INTERACTIVE_SLOTS="0")
    worker_id = doomed.worker_id
    try:
        lines: list[dict[str, Any]] = [
            {
                "custom_id": f"k{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"Tell me about the number {i}."}],
                    "max_tokens": 24,
                    "temperature": 0,
                },
            }
            for i in range(12)
        ]
        batch = start_batch(client, lines)
        deadline = time.monotonic() + 60
        while len(lost := running_on(redis, settings, worker_id)) < SLOTS:
            if lost and time.monotonic() > deadline - 30:
                break  # it got fewer lines than it has slots; kill it anyway
            assert time.monotonic() < deadline, "the second worker took no line"
            time.sleep(0.05)
        stack.kill_worker(doomed)
        done = wait_batch(client, batch.id, timeout_s=240)
    finally:
        if doomed in stack.workers:
            stack.kill_worker(doomed)
    assert done.status == "completed"
    out = lines_of(client, done.output_file_id)
    assert sorted(o["custom_id"] for o in out) == sorted(f"k{i}" for i in range(12))
    assert all(o["response"]["status_code"] == 200 for o in out)
    assert done.error_file_id is None
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (12, 0)
    for job_id in lost:  # each ran again, on the live worker, after one failed try
        job = Job.fetch(job_id, connection=redis, serializer=JSONSerializer)
        # The line's answer is recorded inside the job, RQ's "finished" just after it returns:
        # the batch can be complete a moment before its last line's job is.
        wait_until(partial(_finished, job), 10, f"{job_id} finished")
        assert job.retries_left == settings.batch_line_retries - 1
        assert not (job.worker_name or "").startswith(worker_id + ".")
