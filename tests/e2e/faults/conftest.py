"""Fault tests: each module runs its own cluster of real processes (worker/ops/cluster.py), a
private redis-server, the API under gunicorn and worker processes on the real model, so that
killing a worker or restarting Redis never touches the session stack the other tests share.
Heartbeats are 0.5 s, so "within two heartbeats" means within a second.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from redis import Redis
from rq.job import Job

from shared.queue.liveness import worker_of
from tests.support import MODEL, REAL_ENGINE, rq_job, rq_queue
from worker.ops.cluster import Cluster, Worker

HEARTBEAT_S = 0.5


@pytest.fixture(scope="module")
def start_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Cluster]]:
    """Starts the module's cluster (Redis, the API, `workers` workers; `env` for every process,
    `worker_env` for the workers only) under a namespace named after the module; stops it after
    the module's last test."""
    started: list[Cluster] = []
    name = "mlxq" + request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")

    def start(
        workers: int = 1,
        heartbeat_s: float = HEARTBEAT_S,
        env: dict[str, str] | None = None,
        redis: dict[str, Any] | None = None,
        namespace: str = "",
        **worker_env: str,
    ) -> Cluster:
        """`redis`: the Cluster's Redis fields (port, redis_args, url), where they matter."""
        logs = tmp_path_factory.mktemp(name)
        namespace = namespace or name.replace("_", "")
        env = {**REAL_ENGINE, **(env or {})}
        cluster = Cluster(namespace, heartbeat_s, env=env, logs=logs, **(redis or {}))
        started.append(cluster)
        return cluster.start(workers, **worker_env)

    yield start
    for cluster in started:
        cluster.stop(quick=True)


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
    queue = rq_queue(redis, cluster.keys.queue(MODEL))
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


def wait_started(redis: Redis, job_ids: list[str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(rq_job(redis, j).get_status() == "started" for j in job_ids):
            return
        time.sleep(0.05)
    raise TimeoutError(f"jobs not started: {job_ids}")
