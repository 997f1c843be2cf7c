"""A client that goes away frees its batch slot at once, or its place in the queue if its job
has not started; a background job runs on without one.

Point 5 of the fault contract, on the session's stack: the job record (RQ's result, written
when the slot lets go of the job) shows the cancel within seconds (at the next step).
"""

from __future__ import annotations

import json
import socket
import subprocess
import time

import httpx
from redis import Redis
from rq.job import Job
from rq.serializers import JSONSerializer

from api.queue.broker import standalone
from shared.queue.config import Settings
from shared.queue.jobs import GenerationJob
from shared.queue.keys import Keys
from shared.wire.generation.sampling import SamplingParams
from tests.support import MODEL, Stream, chat_body, rq_queue, stand_in_worker
from worker.ops.cluster import Cluster, wait_until

# A model a stand-in worker announces and never serves: its requests stay queued.
QUEUED_MODEL = "queued-stand-in"


def _outcome(redis: Redis, job_id: str) -> dict[str, object] | None:
    job = Job.fetch(job_id, connection=redis, serializer=JSONSerializer)
    if job.get_status() != "finished":
        return None
    result = job.return_value()
    assert isinstance(result, dict)
    return result


def test_a_client_that_disconnects_mid_stream_frees_its_slot_within_seconds(
    api_url: str, worker_process: subprocess.Popen[bytes], redis: Redis
) -> None:
    stream = Stream(api_url, chat_body(max_tokens=2000))
    job_id = stream.read_tokens(2)
    stream.close()
    left = time.monotonic()
    wait_until(lambda: _outcome(redis, job_id) is not None, 5, "the job to end")
    assert time.monotonic() - left < 3.0  # its 2,000 tokens would take a minute
    outcome = _outcome(redis, job_id)
    assert outcome is not None
    assert outcome["finish_reason"] == "cancelled"
    assert 0 < int(str(outcome["completion_tokens"])) < 2000


def test_a_background_job_nobody_listens_to_runs_to_its_end(
    settings: Settings, worker_process: subprocess.Popen[bytes], redis: Redis
) -> None:
    # Greedy, so that it runs its 8 tokens: sampled at the default temperature, "Once" may be
    # followed by the end token early ("stop" where "length" was asserted, in a full run).
    job = GenerationJob(
        job_id="resp_nobody_listens",
        model=MODEL,
        prompt="Once",
        max_tokens=8,
        replay_ttl_s=600,
        sampling=SamplingParams(temperature=0.0),
    )
    standalone(settings).submit_bulk([job])
    wait_until(lambda: _outcome(redis, job.job_id) is not None, 60, "the job to end")
    outcome = _outcome(redis, job.job_id)
    assert outcome is not None
    assert outcome["finish_reason"] == "length"
    assert outcome["completion_tokens"] == 8
    last = redis.lindex(Keys(settings.namespace).replay(job.job_id), -1)
    assert json.loads(last or b"{}")["type"] == "done"


def test_a_client_that_leaves_while_its_request_is_queued_has_its_job_withdrawn(
    api_url: str, redis: Redis, stack: Cluster
) -> None:
    """Nothing is written to a queued request's client, so only its socket tells that it left
    (api/http/hangup.py): its job comes off the queue and is cancelled within seconds, where it
    waited for its queue timeout (120 s) and then ran for nobody."""
    with stand_in_worker(redis, stack.keys, QUEUED_MODEL):  # alive, never takes a job
        lane = rq_queue(redis, stack.keys.queue(QUEUED_MODEL))
        body = json.dumps(chat_body(model=QUEUED_MODEL, max_tokens=4, stream=True)).encode()
        url = httpx.URL(api_url)
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        with socket.create_connection((url.host, url.port or 80)) as client:
            client.sendall(head.encode() + body)
            wait_until(lambda: lane.count == 1, 30, "the request queued")
            (job_id,) = lane.job_ids
        wait_until(lambda: lane.count == 0, 5, "the job off its queue")
        assert redis.exists(stack.keys.cancelled(job_id))
