"""Redis failover with Sentinel: a primary, a replica and three Sentinels; the API and a worker
reach Redis through `redis+sentinel://` (shared/queue/connection.py), and creating POSTs wait for
the replica (MLXQ_REDIS_WAIT_REPLICAS=1, api/stores/replicas.py). Under load (streams, a
batch, background responses) the primary is killed with SIGKILL; the Sentinels promote the
replica and everyone follows it by itself.

Measured and written to tests/artifacts/failover.json: the seconds until a new request is
served again, the streams that ended with an error, and the batch lines and background
responses lost or run twice (a run is a worker's `job` log line)."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import openai
import pytest
from redis import Redis
from redis.exceptions import ResponseError

from tests.support import MODEL, Stream, chat_body, chat_line, lines_of, start_batch
from worker.ops.cluster import (
    ROOT,
    Cluster,
    free_port,
    start_redis,
    start_sentinel,
    stop,
    wait_until,
)

SERVICE = "mlxqfailover"
LINES = 16
BACKGROUND = 6
STREAMERS = 3
INFO_PERIOD_MS = 10_000  # Sentinel's own


@dataclass
class Group:
    cluster: Cluster
    sentinels: list[Redis]
    replica_port: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def primary_port(self) -> int:
        return int(self.sentinels[0].sentinel_get_master_addr_by_name(SERVICE)[1])


@pytest.fixture(scope="module")
def group(
    start_cluster: Callable[..., Cluster], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Group]:
    folder = tmp_path_factory.mktemp("sentinels")
    primary, replica = free_port(), free_port()
    ports = [free_port() for _ in range(3)]
    procs = [start_sentinel(p, primary, SERVICE, folder / str(p)) for p in ports]
    url = f"redis+sentinel://{','.join(f'127.0.0.1:{p}' for p in ports)}/{SERVICE}/0"
    sentinels = [Redis(port=p, socket_timeout=2) for p in ports]
    cluster: Cluster | None = None
    try:
        # The replica first, to attach as soon as the primary is up; the Sentinels learn of it
        # from the primary's INFO, which they ask for every 10 s: every 0.5 s until the group
        # is formed, then every 10 s again, so the failover runs on Sentinel's own timing.
        _info_period_ms(sentinels, 500)
        procs.append(start_redis(replica, extra=["--replicaof", "127.0.0.1", str(primary)]))
        cluster = start_cluster(
            redis={"port": primary, "url": url},
            env={
                "MLXQ_BATCH_SIZE": "8",
                "MLXQ_LOG_FORMAT": "json",
                "MLXQ_REDIS_WAIT_REPLICAS": "1",
            },
        )
        formed = Group(cluster, sentinels, replica, procs)
        wait_until(lambda: _formed(formed), 60, "the Sentinels to know the replica and each other")
        _info_period_ms(sentinels, INFO_PERIOD_MS)
        yield formed
    finally:
        if cluster is not None:
            cluster.stop(quick=True)  # while Redis is there: the worker exits through it
        for proc in procs:
            stop(proc)


def _info_period_ms(sentinels: list[Redis], ms: int) -> None:
    """How often the Sentinels ask the primary for INFO (`SENTINEL DEBUG`, Redis 7.0 and later;
    an older Sentinel keeps its 10 s)."""
    for sentinel in sentinels:
        try:
            sentinel.execute_command("SENTINEL", "DEBUG", "INFO-PERIOD", ms)
        except ResponseError:
            return


def _formed(group: Group) -> bool:
    for sentinel in group.sentinels:
        state = sentinel.sentinel_master(SERVICE)
        if state["num-slaves"] < 1 or state["num-other-sentinels"] < 2:
            return False
    replica = Redis(port=group.replica_port, socket_timeout=2)
    return replica.info("replication")["master_link_status"] == "up"


@dataclass
class Load:
    """Streaming clients in a loop until stopped: how each stream ended."""

    api_url: str
    ended: Counter[str] = field(default_factory=Counter)
    stopping: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stopping.is_set():
            self.ended[self._one()] += 1

    def _one(self) -> str:
        try:
            stream = Stream(self.api_url, chat_body(max_tokens=24))
            if stream.status != 200:
                stream.close()
                time.sleep(0.2)
                return f"refused {stream.status}"
            last = stream.rest()[-1]
        except (httpx.HTTPError, IndexError):
            time.sleep(0.2)
            return "connection error"
        return "completed" if last == "[DONE]" else "ended with an error"


def _served(api_url: str) -> bool:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    try:
        return httpx.post(f"{api_url}/v1/chat/completions", json=body, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _write_ms(redis: Redis, wait: bool, times: int = 300) -> float:
    """The median time of one write, alone or followed by WAIT for one replica."""
    spent = []
    for _ in range(times):
        started = time.perf_counter()
        pipe = redis.pipeline(transaction=False)
        pipe.set("mlxqfailover:probe", 1)
        if wait:
            pipe.wait(1, 1000)
        pipe.execute()
        spent.append(time.perf_counter() - started)
    return round(sorted(spent)[times // 2] * 1000, 3)


def _runs(cluster: Cluster) -> Counter[str]:
    """How often each job ended on a worker, from the workers' JSON `job` log lines."""
    assert cluster.logs is not None
    runs: Counter[str] = Counter()
    for line in (cluster.logs / "worker.log").read_text(errors="replace").splitlines():
        if line.startswith("{") and '"message": "job"' in line:
            record = json.loads(line)
            if record.get("lane") in ("batch", "background"):
                runs[record["job_id"]] += 1
    return runs


def test_after_the_primary_dies_the_stack_follows_the_promoted_replica(group: Group) -> None:
    cluster = group.cluster
    client = openai.OpenAI(base_url=f"{cluster.api_url}/v1", api_key="unused", max_retries=0)
    load = Load(cluster.api_url)
    # Daemons: a test that fails before it stops them must not keep pytest from exiting.
    streamers = [threading.Thread(target=load.run, daemon=True) for _ in range(STREAMERS)]
    for thread in streamers:
        thread.start()
    lines = [
        chat_line(f"line-{i}", f"Count from {i} to {i + 30}.", max_tokens=24, temperature=0)
        for i in range(LINES)
    ]
    batch = start_batch(client, lines)
    background = [
        client.responses.create(
            model=MODEL, input=f"Say {i}", max_output_tokens=16, background=True
        )
        for i in range(BACKGROUND)
    ]
    wait_until(
        lambda: (client.batches.retrieve(batch.id).request_counts.completed or 0) >= 2,  # type: ignore[union-attr]
        120,
        "the first lines",
    )
    old_primary = group.primary_port()
    primary = cluster.redis()
    write_ms = {"alone": _write_ms(primary, False), "with_wait_1": _write_ms(primary, True)}
    killed = cluster.redis_proc
    assert killed is not None
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    cluster.redis_proc = None
    down = time.monotonic()
    wait_until(lambda: group.primary_port() != old_primary, 60, "the Sentinels to promote")
    promoted_s = time.monotonic() - down
    wait_until(lambda: _served(cluster.api_url), 120, "a request served after the failover")
    recovered_s = time.monotonic() - down
    assert group.primary_port() == group.replica_port

    done = _wait_batch(client, batch.id)
    responses = [_wait_response(client, r.id) for r in background]
    load.stopping.set()
    for thread in streamers:
        thread.join(timeout=120)
    out = lines_of(client, done.output_file_id)
    errors = lines_of(client, done.error_file_id)
    ran = _runs(cluster)
    figures = {
        "median_write_ms_under_load": write_ms,
        "seconds_until_promoted": round(promoted_s, 2),
        "seconds_until_served_again": round(recovered_s, 2),
        "streams": dict(load.ended),
        "batch_status": done.status,
        "batch_lines_in_output": len(out),
        "batch_lines_in_error_file": len(errors),
        "batch_lines_missing": LINES - len({line["custom_id"] for line in out + errors}),
        "background_statuses": dict(Counter(r.status for r in responses)),
        "bulk_jobs_run_more_than_once": sorted(j for j, n in ran.items() if n > 1),
    }
    artifacts = ROOT / "tests" / "artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "failover.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    assert done.status == "completed"
    assert figures["batch_lines_missing"] == 0
    assert sorted(line["custom_id"] for line in out) == sorted(f"line-{i}" for i in range(LINES))
    assert all(r.status in ("completed", "incomplete") and not r.error for r in responses)
    assert load.ended["completed"] > 0


def _wait_batch(client: openai.OpenAI, batch_id: str) -> openai.types.Batch:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            batch = client.batches.retrieve(batch_id)
        except openai.APIError:
            time.sleep(0.5)
            continue
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        time.sleep(0.5)
    raise TimeoutError(f"batch {batch_id} did not finish")


def _wait_response(client: openai.OpenAI, response_id: str) -> openai.types.responses.Response:
    deadline = time.monotonic() + 120
    while True:
        current = client.responses.retrieve(response_id)
        if current.status not in ("queued", "in_progress") or time.monotonic() > deadline:
            return current
        time.sleep(0.2)
