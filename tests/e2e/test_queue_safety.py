"""The queue carries data only: nothing written into Redis makes a worker import or unpickle code.

Each hostile job below would create a marker file if the worker ran what it asks for; the test
shows that none does, that each job ends refused in RQ's failed registry, and that the worker
goes on serving.
"""

from __future__ import annotations

import pickle
import subprocess
import time
from pathlib import Path

import openai
from redis import Redis
from rq import Callback, Queue
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from shared.queue.config import Settings
from shared.queue.jobs import JOB_FUNCTION
from shared.queue.keys import Keys
from tests.support import MODEL

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


class CreatesFileWhenUnpickled:
    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.path), "w"))


def touch_marker(job: Job, connection: Redis, *args: object) -> None:
    """A callback a hostile job names: running it would create the marker file."""
    Path(job.meta["marker"]).touch()


def served_queue(settings: Settings, redis: Redis) -> Queue:
    return Queue(Keys(settings.namespace).queue(MODEL), connection=redis, serializer=JSONSerializer)


def push_pickled_job(queue: Queue, redis: Redis, marker: Path) -> Job:
    job = Job.create(
        JOB_FUNCTION,
        args=({},),
        connection=redis,
        serializer=JSONSerializer,
        origin=queue.name,
        status=JobStatus.QUEUED,
    )
    job.save()
    redis.hset(job.key, "data", pickle.dumps(CreatesFileWhenUnpickled(marker)))
    queue.push_job_id(job.id)
    return job


def wait_for_failure(job: Job, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job.refresh()
        if job.get_status() == JobStatus.FAILED:
            result = job.latest_result()
            return result.exc_string if result is not None and result.exc_string else ""
        time.sleep(0.1)
    raise AssertionError(f"job {job.id} is {job.get_status()}, not failed")


def test_pickled_payloads_foreign_functions_and_callbacks_are_refused(
    client: openai.OpenAI,
    worker_process: subprocess.Popen[bytes],
    settings: Settings,
    redis: Redis,
    tmp_path: Path,
) -> None:
    queue = served_queue(settings, redis)
    markers = {name: tmp_path / name for name in ("pickle", "function", "callback")}
    pickled = push_pickled_job(queue, redis, markers["pickle"])
    foreign = queue.enqueue_call("builtins.open", args=(str(markers["function"]), "w"))
    with_callback = queue.enqueue_call(
        JOB_FUNCTION,
        args=({"job_id": "x", "model": MODEL, "prompt": "hi"},),
        meta={"marker": str(markers["callback"])},
        on_success=Callback(f"{__name__}.touch_marker"),
        on_failure=Callback(f"{__name__}.touch_marker"),
    )

    assert "not JSON" in wait_for_failure(pickled)
    assert "builtins.open" in wait_for_failure(foreign)
    assert "callbacks" in wait_for_failure(with_callback)
    assert not any(marker.exists() for marker in markers.values())

    reply = client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0)
    assert "Paris" in (reply.choices[0].message.content or "")
    assert worker_process.poll() is None
