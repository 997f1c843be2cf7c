"""Fault tests: each module runs its own cluster of real processes (bench/cluster.py), a
private redis-server, the API under gunicorn and worker processes on the real model, so that
killing a worker or restarting Redis never touches the session stack the other tests share.
Heartbeats are 0.5 s, so "within two heartbeats" means within a second.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from redis import Redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from bench.cluster import MODEL, Cluster, Worker
from shared.liveness import worker_of

HEARTBEAT_S = 0.5
STORY = [{"role": "user", "content": "Write a very long story about a dragon and a knight."}]


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": STORY, "temperature": 0, **extra}


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: Any
    seconds: float
    ended: float  # time.monotonic() when the reply was complete


def post(base_url: str, path: str, body: dict[str, Any], timeout: float = 120) -> Reply:
    """One request and its whole (non-streaming) reply."""
    url = urlparse(base_url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=timeout)
    started = time.monotonic()
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        headers = {k.lower(): v for k, v in response.getheaders()}
        ended = time.monotonic()
        return Reply(response.status, headers, json.loads(data), ended - started, ended)
    finally:
        conn.close()


@dataclass
class Stream:
    """A raw SSE request: its `data:` payloads as they arrive. `close` is a client leaving."""

    base_url: str
    body: dict[str, Any]
    path: str = "/v1/chat/completions"
    status: int = 0
    payloads: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        url = urlparse(self.base_url)
        self._conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=60)
        body = json.dumps({**self.body, "stream": True})
        self._conn.request("POST", self.path, body, {"Content-Type": "application/json"})
        self._response = self._conn.getresponse()
        self.status = self._response.status

    def frames(self) -> Iterator[str]:
        while True:
            line = self._response.readline()
            if not line:
                return
            text = line.decode().strip()
            if text.startswith("data: "):
                self.payloads.append(text[6:])
                yield text[6:]

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
        self._conn.close()


def rq_job(redis: Redis, job_id: str) -> Job:
    return Job.fetch(job_id, connection=redis, serializer=JSONSerializer)


def holder(cluster: Cluster, job_id: str) -> Worker:
    """The worker process whose slot runs the job."""
    job = rq_job(cluster.redis(), job_id)
    assert job.worker_name, f"job {job_id} is not started"
    return cluster.worker_by_id(worker_of(job.worker_name))


def started_ids(cluster: Cluster, worker: Worker | None = None) -> list[str]:
    """The interactive jobs running now (on `worker` if given): in RQ's started registry and
    marked started.

    RQ adds a job to the registry a moment before it sets the job's status, and a job in that
    window still reads as queued to everyone else.
    """
    redis = cluster.redis()
    queue = Queue(cluster.keys.queue(MODEL), connection=redis, serializer=JSONSerializer)
    ids = list(queue.started_job_registry.get_job_ids(cleanup=False))
    pipe = redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(Job.key_for(job_id), ["status", "worker_name"])
    return [
        job_id
        for job_id, (status, name) in zip(ids, pipe.execute(), strict=True)
        if status == b"started"
        and (worker is None or worker_of(name.decode() if name else "") == worker.worker_id)
    ]


def exactly_workers(cluster: Cluster, n: int, **env: str) -> list[Worker]:
    """Kill extra workers and those started with another `env`, start missing ones."""
    for worker in [w for w in cluster.workers if w.proc.poll() is not None]:
        cluster.workers.remove(worker)
    for worker in [w for w in cluster.workers if w.env != env]:
        cluster.kill_worker(worker)
    while len(cluster.workers) > n:
        cluster.kill_worker(cluster.workers[-1])
    pending = [cluster.start_worker(wait=False, **env) for _ in range(n - len(cluster.workers))]
    for worker in pending:
        cluster.wait_for_worker(worker)
    return list(cluster.workers)


def wait_for(check: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise TimeoutError(f"timed out waiting for {what}")


def wait_started(redis: Redis, job_ids: list[str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(rq_job(redis, j).get_status() == "started" for j in job_ids):
            return
        time.sleep(0.05)
    raise TimeoutError(f"jobs not started: {job_ids}")
