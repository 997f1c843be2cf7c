"""What the tests share, in one place: the model they ask for, the check of OpenAI's error body,
plain requests and SSE streams (httpx with httpx-sse), Batch and Responses API steps through
the SDK, RQ lookups, the flush of a test's namespace, and the models the tests make from others
and keep between runs (`derived_model`: the Gemma GGUF import, the quantized default model).

Starting processes is not here: that is worker/ops/cluster.py, the harness `mlxq run` and the
benchmarks use too.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from flask.testing import FlaskClient
from httpx_sse import EventSource, connect_sse
from openai.types import Batch
from openai.types.responses import Response
from redis import Redis
from redis.client import PubSub
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer
from werkzeug.test import TestResponse

from shared.observe.fleet import WorkerStats, publish_stats, read_snapshot
from shared.observe.metrics import RECENT_JOBS, JobRecord
from shared.queue import turns
from shared.queue.config import Settings
from shared.queue.jobs import LANES, Lane
from shared.queue.keys import Keys
from shared.wire.errors import QueueTimeoutError
from shared.wire.events import ErrorEvent, encode_event, encode_frame
from worker.gguf.default_model import DEFAULT_MODEL_NAME
from worker.ops.cluster import wait_until

MODEL = DEFAULT_MODEL_NAME
# The end-to-end clusters' environment: the real engine, whatever the defaults become.
REAL_ENGINE = {"MLXQ_ENGINE": "mlx"}
# The one skip the test command allows (tests/conftest.py): a machine whose kernel refuses to make
# network namespaces cannot run tests/e2e/faults/test_remote_worker.py (`add_network_namespace`).
NEEDS_NETNS = "needs network namespaces"
# How the kernel refuses a process the right to make one (an unprivileged user, a container
# without CAP_SYS_ADMIN): `ip` prints the strerror of one of these.
_REFUSALS = (errno.EPERM, errno.EACCES)
STAND_IN = "stand-in.1"  # the worker id of `stand_in_worker`
CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hi"}]
STORY = [{"role": "user", "content": "Write a very long story about a dragon and a knight."}]
# The default model's end tokens (<|im_end|>, <|endoftext|>) as a logit_bias that forbids them,
# for a request that must run to its max_tokens whatever the machine's arithmetic samples.
NO_END = {"2": -100, "0": -100}

# OpenAI's error body


def chat(http: FlaskClient, **body: Any) -> TestResponse:
    """A chat request to the in-process app, for a model that need not exist."""
    return http.post(CHAT, json={"model": "m", "messages": MESSAGES, **body})


def post_file(
    http: FlaskClient, data: bytes, purpose: str = "batch", headers: dict[str, str] | None = None
) -> TestResponse:
    """An upload of `data` (as in.jsonl) to the in-process app."""
    form = {"purpose": purpose, "file": (io.BytesIO(data), "in.jsonl")}
    return http.post("/v1/files", data=form, content_type="multipart/form-data", headers=headers)


def batch_body(file_id: str) -> dict[str, str]:
    """The body of a batch of text completions over the file `file_id`."""
    return {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}


def assert_openai_error(response: TestResponse, status: int, param: str | None = None) -> None:
    assert response.status_code == status, response.get_data(as_text=True)
    body = response.get_json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param


# Requests and streams over HTTP


def chat_body(**extra: Any) -> dict[str, Any]:
    """A chat request for the real model that runs as long as `max_tokens` lets it."""
    return {"model": MODEL, "messages": STORY, "temperature": 0, **extra}


@dataclass
class Reply:
    status: int
    headers: httpx.Headers
    body: Any
    seconds: float
    ended: float  # time.monotonic() when the reply was complete


def post(base_url: str, path: str, body: dict[str, Any], timeout: float = 120) -> Reply:
    """One request and its whole (non-streaming) reply."""
    started = time.monotonic()
    response = httpx.post(f"{base_url}{path}", json=body, timeout=timeout)
    ended = time.monotonic()
    return Reply(response.status_code, response.headers, response.json(), ended - started, ended)


@dataclass
class Stream:
    """A streamed request: its `data:` payloads as they arrive. `close` is a client leaving; a
    stream that ended (or broke) closes itself, so its connection is not left to the collector."""

    base_url: str
    body: dict[str, Any]
    path: str = CHAT
    payloads: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._client = httpx.Client(base_url=self.base_url, timeout=60)
        body = {**self.body, "stream": True}
        self._request: AbstractContextManager[EventSource] = connect_sse(
            self._client, "POST", self.path, json=body
        )
        self._source = self._request.__enter__()
        self._events = self._source.iter_sse()

    @property
    def status(self) -> int:
        return self._source.response.status_code

    def frames(self) -> Iterator[str]:
        try:
            for event in self._events:
                self.payloads.append(event.data)
                yield event.data
        except Exception:  # not GeneratorExit: `read_tokens` leaves a stream open to read on
            self.close()
            raise
        self.close()

    def read_tokens(self, n: int) -> str:
        """Read until `n` content chunks arrived; returns the response id."""
        seen = 0
        for payload in self.frames():
            chunk = json.loads(payload)
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                seen += 1
                if seen >= n:
                    return str(chunk["id"])
        raise AssertionError(f"the stream ended after {seen} tokens: {self.payloads[-3:]}")

    def rest(self) -> list[str]:
        return list(self.frames())

    def close(self) -> None:
        if not self._client.is_closed:
            self._request.__exit__(None, None, None)
            self._client.close()


# The Batch and Responses APIs through the SDK


def chat_line(custom_id: str, content: str, **body: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], **body}
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}


def upload(client: openai.OpenAI, lines: list[dict[str, Any]] | bytes) -> str:
    data = lines if isinstance(lines, bytes) else "\n".join(map(json.dumps, lines)).encode()
    return client.files.create(file=("in.jsonl", data), purpose="batch").id


def start_batch(
    client: openai.OpenAI, lines: list[dict[str, Any]] | bytes, endpoint: str = CHAT
) -> Batch:
    """A batch of `lines`, as it is once its intake process has checked its first lines (no
    longer `validating`: `in_progress`, or `failed` with its errors)."""
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
    )
    deadline = time.monotonic() + 60
    while batch.status == "validating":
        assert time.monotonic() < deadline, "the batch is still validating"
        time.sleep(0.1)
        batch = client.batches.retrieve(batch.id)
    return batch


def taken_in(redis: Redis, keys: Keys, batch_id: str, timeout_s: float = 60) -> None:
    """Wait until the batch's intake process has ended (api/stores/batch_feed.py): every line
    recorded and queued, or the batch failed or stopped."""
    batch = keys.batch(batch_id)
    wait_until(lambda: not redis.hexists(batch, "intake_until"), timeout_s, "the batch's intake")


# A file chunk's size (MLXQ_FILE_CHUNK_BYTES) under which a small file is kept in several.
SMALL_CHUNK = 4096
# What a batch reads while its finalizer process writes its files (api/stores/batch_finalize.py).
SETTLING = ("finalizing", "cancelling")


def read_until(
    http: FlaskClient,
    path: str,
    done: Callable[[dict[str, Any]], bool],
    headers: dict[str, str] | None = None,
    timeout_s: float = 60,
) -> dict[str, Any]:
    """GET `path` (a batch, of the in-process app) until `done` holds of what it answers."""
    deadline = time.monotonic() + timeout_s
    while True:
        reply = http.get(path, headers=headers)
        assert reply.status_code == 200, reply.get_data(as_text=True)
        found: dict[str, Any] = reply.get_json()
        if done(found):
            return found
        assert time.monotonic() < deadline, f"{path} still answers {found}"
        time.sleep(0.1)


def settled(
    http: FlaskClient, batch_id: str, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """The batch once it no longer reads `finalizing` or `cancelling`: a read that finds it
    due starts its finalization, which then ends in a process of its own."""
    return read_until(
        http, f"/v1/batches/{batch_id}", lambda b: b["status"] not in SETTLING, headers
    )


def ended_message_batch(http: FlaskClient, batch_id: str) -> dict[str, Any]:
    """The message batch once it has ended (its finalization too)."""
    path = f"/v1/messages/batches/{batch_id}"
    return read_until(http, path, lambda b: b["processing_status"] == "ended")


def wait_batch(client: openai.OpenAI, batch_id: str, timeout_s: float = 120) -> Batch:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.25)


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def poll(
    client: openai.OpenAI, response_id: str, until: Callable[[Response], bool], timeout_s: float
) -> Response:
    deadline = time.monotonic() + timeout_s
    while True:
        current = client.responses.retrieve(response_id)
        if until(current) or time.monotonic() > deadline:
            return current
        time.sleep(0.1)


def finished(r: Response) -> bool:
    return r.status in ("completed", "incomplete", "failed", "cancelled")


# RQ and Redis


@contextmanager
def stand_in_worker(redis: Redis, keys: Keys, model: str = MODEL) -> Iterator[PubSub]:
    """A worker for `model` that is alive (a heartbeat an hour ahead and a presence
    subscription) and never takes a job, so the API admits requests and they wait. Closing the
    returned presence connection is the worker dying."""
    presence = redis.pubsub()
    presence.subscribe(keys.presence(STAND_IN))
    redis.zadd(keys.workers(model), {STAND_IN: time.time() + 3600})
    redis.zadd(keys.models(), {model: time.time() + 3600})
    try:
        yield presence
    finally:
        presence.close()
        # Gone as a worker that stops leaves, so a shared namespace (the session stack's)
        # lists no model the stand-in announced for the next tests.
        redis.zrem(keys.workers(model), STAND_IN)
        if not redis.zcard(keys.workers(model)):
            redis.zrem(keys.models(), model)


def rq_job(redis: Redis, job_id: str) -> Job:
    return Job.fetch(job_id, connection=redis, serializer=JSONSerializer)


def publish_as_worker(redis: Redis, keys: Keys, job_id: str, *events: bytes) -> None:
    """Publish encoded events of a queued job where a worker would: on the reply channel of
    the API process waiting on it, one frame per event (shared/wire/events.py)."""
    reply_to = rq_job(redis, job_id).args[0]["reply_to"]
    for data in events:
        redis.publish(keys.reply(reply_to), encode_frame([(job_id, data)]))


def finish_queued(redis: Redis, keys: Keys, model: str = MODEL, *taken: str) -> None:
    """End every request waiting in `model`'s lanes, and the jobs `taken` off them, with the
    answer its queue timeout would give (503 queue_timeout), sent as a worker sends an error,
    so that a test which has read the queue need not wait out the timeout itself."""
    timeout = encode_event(ErrorEvent.from_error(QueueTimeoutError("ended by the test")))
    waiting = [job_id for lane in LANES for job_id in queued_ids(redis, keys, model, lane)]
    for job_id in [*waiting, *taken]:
        publish_as_worker(redis, keys, job_id, timeout)


def recent_jobs(redis: Redis, settings: Settings) -> list[JobRecord]:
    """The jobs the fleet recorded last (shared/observe/metrics.py), newest first, as workers
    recorded them when each ended: lane, times, tokens, finish reason."""
    keys = Keys(settings.namespace)
    return read_snapshot(redis, keys, settings.heartbeat_s, recent=RECENT_JOBS).recent_jobs


def queued_ids(redis: Redis, keys: Keys, model: str, lane: Lane) -> list[str]:
    """The ids waiting in a lane: its own list, then each caller's (shared/queue/turns.py)."""
    lists = turns.lane_lists(redis, keys, model, lane)
    return [bytes(i).decode() for key in lists for i in redis.lrange(key, 0, -1)]


def waiting_in(redis: Redis, keys: Keys, model: str, lane: Lane) -> int:
    return len(queued_ids(redis, keys, model, lane))


def rq_queue(redis: Redis, name: str) -> Queue:
    """An mlxq queue as RQ sees it (`name` from shared/queue/keys.py: `queue`, `lanes`...)."""
    return Queue(name, connection=redis, serializer=JSONSerializer)


def flush_namespace(redis: Redis, namespace: str) -> None:
    """Delete everything a namespace holds: its own keys, its RQ queues and registries, and the
    RQ jobs queued on them."""
    doomed: set[bytes] = set(redis.scan_iter(f"{namespace}:*", count=1000))
    rq_keys = set(redis.scan_iter(f"rq:*:{namespace}.*", count=1000))
    for key in rq_keys:
        if key.startswith(b"rq:queue:"):
            doomed |= {Job.key_for(i.decode()) for i in redis.lrange(key, 0, -1)}
    doomed |= rq_keys
    if doomed:
        redis.delete(*doomed)


# Models made from others, kept between runs


def derived_model(parent: Path, prefix: str, key: str, make: Callable[[Path], None]) -> Path:
    """A model folder the tests make from others (a GGUF import, a quantization), kept under
    `parent` as `{prefix}{key}`, where `key` digests everything it is made from: a rerun (another
    checkout's too) finds it and makes nothing; a new key makes it again and removes the folders
    the older keys left (`{prefix}*`, each maybe a gigabyte). `make(folder)` writes the model
    into `folder`, which does not exist yet: it is built beside the target and renamed into place,
    so a folder half made (a run killed, two test processes at once) is never found."""
    target = parent / f"{prefix}{key}"
    if (target / "config.json").is_file():
        return target
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(f"{prefix}*"):
        shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=f".{prefix}", dir=parent) as tmp:
        building = Path(tmp) / target.name
        make(building)
        try:
            os.rename(building, target)
        except OSError:  # another process got there first
            if not (target / "config.json").is_file():
                raise
    return target


# Network namespaces


def add_network_namespace(name: str) -> None:
    """`ip netns add name`. Where the kernel refuses (EPERM, EACCES: `ip` says "Operation not
    permitted" or "Permission denied") the test is skipped with NEEDS_NETNS and the error number;
    any other failure, a missing `ip` included, fails it."""
    done = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if done.returncode == 0:
        return
    said = done.stderr.strip()
    for number in _REFUSALS:
        if os.strerror(number) in said:
            code = errno.errorcode[number]
            pytest.skip(
                f"{NEEDS_NETNS}: the kernel refused `ip netns add` (errno {number}, {code}): {said}"
            )
    raise AssertionError(f"`ip netns add {name}` failed (exit {done.returncode}): {said}")


def announce(
    redis: Redis,
    keys: Keys,
    worker_id: str,
    busy: int,
    at: float,
    heartbeat_s: float,
    host: str = "host-a",
    model: str = MODEL,
) -> None:
    """What a live worker's heartbeat writes (worker/runtime/liveness/heartbeat.py): its model and
    its report, `busy` interactive rows running, at time `at`."""
    stats = WorkerStats(
        worker_id=worker_id,
        host=host,
        model=model,
        batch_size=8,
        running={"interactive": busy, "background": 1, "batch": 0},
        tokens_per_s=12.5,
        generated_tokens=100,
        started_at=at - 60,
    )
    pipe = redis.pipeline()
    pipe.zadd(keys.models(), {model: at})
    pipe.zadd(keys.workers(model), {worker_id: at})
    publish_stats(pipe, keys, stats, heartbeat_s)
    pipe.execute()
