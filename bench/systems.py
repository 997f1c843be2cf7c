"""The systems under test, each started by the benchmark and stopped after its runs.

- mlxq: a private redis-server, worker process(es) and the API under gunicorn.
- the peer: `mlx_lm.server` on the same model directory.
Both get the system OpenBLAS preloaded where it exists, as the mlxq worker does for itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from redis import Redis

from worker.ops.cluster import Cluster, environment, free_port, http_answers, stop, wait_until
from worker.runtime.blas import find_openblas


@dataclass
class Running:
    """A started system: where to send requests and which processes to account CPU to."""

    port: int
    model: str
    api_pids: list[int] = field(default_factory=list)
    redis: Redis | None = None  # mlxq's Redis, for its memory figures
    worker_pids: list[int] = field(default_factory=list)
    redis_pids: list[int] = field(default_factory=list)
    namespace: str = ""


HEARTBEAT_S = 2.0  # the worker's default


def blas_env() -> dict[str, str]:
    library = find_openblas()
    return {"LD_PRELOAD": library} if library and sys.platform.startswith("linux") else {}


def _serves(port: int, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1) as r:
            return model in {m["id"] for m in json.load(r)["data"]}
    except OSError:
        return False


def cpu_seconds(pids: list[int]) -> float:
    """User+system CPU time of these processes so far (Linux /proc)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores (Linux /proc/stat):
    their ratio over a run says whether the machine itself was the limit."""
    user, nice, system, idle, iowait, *rest = (
        int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]
    )
    busy = user + nice + system + sum(rest[:3])  # irq, softirq, steal
    tick = os.sysconf("SC_CLK_TCK")
    return busy / tick, (busy + idle + iowait) / tick


@contextmanager
def mlxq(
    model_dir: Path, batch_size: int, settings: dict[str, str] | None = None, workers: int = 1
) -> Iterator[Running]:
    settings = settings or {}
    env = {"MLXQ_BATCH_SIZE": str(batch_size), **blas_env(), **settings}
    cluster = Cluster(namespace="bench", heartbeat_s=HEARTBEAT_S, model=str(model_dir), env=env)
    name = settings.get("MLXQ_MODEL", model_dir.name)
    try:
        cluster.start_redis()
        for _ in range(workers):
            cluster.start_worker(wait=False)
        cluster.start_api()
        port = int(cluster.api_url.rsplit(":", 1)[1])
        wait_until(lambda: _serves(port, name), 300, "mlxq to serve the model")
        assert cluster.api_proc is not None
        pids = [cluster.api_proc.pid, *cluster.api_worker_pids()]
        assert cluster.redis_proc is not None
        worker_pids = [w.proc.pid for w in cluster.workers]
        redis_pids = [cluster.redis_proc.pid]
        yield Running(
            port,
            name,
            pids,
            cluster.redis(),
            namespace=cluster.namespace,
            worker_pids=worker_pids,
            redis_pids=redis_pids,
        )
    finally:
        cluster.stop()


@contextmanager
def peer(model_dir: Path) -> Iterator[Running]:
    port = free_port()
    args = ["--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
    env = environment(**blas_env())
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlx_lm", "server", *args], env=env, stderr=subprocess.DEVNULL
    )
    try:
        wait_until(lambda: http_answers(f"http://127.0.0.1:{port}/v1/models"), 300, "the peer")
        yield Running(port, str(model_dir), [proc.pid])
    finally:
        stop(proc)
