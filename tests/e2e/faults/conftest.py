"""Fault tests: each module runs its own cluster of real processes (worker/ops/cluster.py), a
private redis-server, the API under gunicorn and worker processes on the real model, so that
killing a worker or restarting Redis never touches the session stack the other tests share.
Heartbeats are 0.5 s, so "within two heartbeats" means within a second.

`client` is the OpenAI SDK on the module's cluster. A pool module (test_pool.py,
test_pool_page.py) starts its cluster with no worker and a pool agent (`start_pool_cluster`)
whose catalog is `models_dir`: the default model under three names and a model whose weights
are corrupt; `pool_report` reads what the pool publishes.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from redis import Redis
from rq.job import Job

from shared.queue import pool as pools
from shared.queue.config import Settings
from shared.queue.liveness import worker_of
from shared.wire.fleet.pool import MIB, PoolReport
from tests.support import MODEL, REAL_ENGINE, rq_job, rq_queue
from worker.gguf.default_model import ensure_default_model
from worker.ops.cluster import Cluster, Worker, wait_until

HEARTBEAT_S = 0.5
# The pool's catalog (`models_dir`) and what each of its models is given.
POOL_MODELS = ("alpha", "beta", "gamma")
ROWS, CONTEXT = 2, 512
HEADROOM_MB, PREFIX_MB = 512, 16
LOAD_S = 180  # a load on a loaded 2-core machine


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


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> openai.OpenAI:
    """The OpenAI SDK on the module's cluster (the `cluster` fixture each module defines)."""
    return openai.OpenAI(base_url=f"{cluster.api_url}/v1", api_key="unused", max_retries=0)


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


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """alpha, beta and gamma: the default model (links); broken: its config and tokenizer with
    weights cut off after their header."""
    real = ensure_default_model(Settings().models_dir)
    folder = tmp_path_factory.mktemp("pool-models")
    native = Settings().models_dir / ".native"  # the CPU matvec, built once beside the models
    if native.is_dir():
        (folder / ".native").symlink_to(native)
    for name in POOL_MODELS:
        (folder / name).symlink_to(real)
    broken = folder / "broken"
    broken.mkdir()
    for file in real.iterdir():
        if file.suffix != ".safetensors":
            (broken / file.name).symlink_to(file)
    with (real / "model.safetensors").open("rb") as f:
        head = f.read(8)
        (size,) = struct.unpack("<Q", head)
        (broken / "model.safetensors").write_bytes(head + f.read(size) + b"\0" * 64)
    return folder


def one_cost(models_dir: Path) -> int:
    """What the pool counts for one model of `models_dir` (worker/pool/catalog.py)."""
    weights = (models_dir / "alpha" / "model.safetensors").stat().st_size
    per_token = 30 * 3 * 64 * 2 * 4
    prefix = max(PREFIX_MB * MIB, per_token * 8192)  # at least one whole window's conversation
    return weights + per_token * ROWS * CONTEXT + prefix + HEADROOM_MB * MIB


def start_pool_cluster(
    start_cluster: Callable[..., Cluster], models_dir: Path, models: float
) -> Cluster:
    """The module's cluster with no worker and a pool agent whose budget holds `models` of
    `models_dir`'s models; returns once the pool has reported."""
    budget_mb = int(models * one_cost(models_dir)) // MIB
    env = {
        "MLXQ_MODELS_DIR": str(models_dir),
        "MLXQ_POOL_BUDGET_MB": str(budget_mb),
        "MLXQ_POOL_ROWS": str(ROWS),
        "MLXQ_POOL_KV_TOKENS": str(ROWS * CONTEXT),
        "MLXQ_PREFIX_CACHE_MB": str(PREFIX_MB),
        "MLXQ_POOL_HEADROOM_MB": str(HEADROOM_MB),
        "MLXQ_POOL_COOLDOWN_S": "0",
        "MLXQ_POOL_STABLE_S": "1",
        "MLXQ_DRAIN_TIMEOUT_S": "5",
        "MLXQ_QUEUE_TIMEOUT_S": str(LOAD_S),
    }
    cluster = start_cluster(workers=0, env=env)
    cluster.start_pool()
    wait_until(lambda: pool_report(cluster) is not None, 60, "the pool's first report")
    return cluster


def pool_report(cluster: Cluster) -> PoolReport | None:
    """The report of the cluster's one pool, read from Redis."""
    found = pools.read_reports(cluster.redis(), cluster.keys, cluster.heartbeat_s)
    return found[0] if found else None


def ask(client: openai.OpenAI, model: str, **extra: object) -> str:
    """A short answer of `model` (`extra`: fields of the body that the SDK does not know)."""
    answer = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hi"}],
        max_tokens=4,
        temperature=0,
        extra_body=extra or None,
    )
    return answer.choices[0].message.content or ""
