"""mlxq's processes on this machine, for `mlxq run`, the benchmarks and the tests alike: a
private redis-server, worker processes and the API under gunicorn, each started, waited for,
killed and stopped here, and nowhere else.

A `Cluster` is one Redis, at most one API and any number of workers under one namespace. Its
Redis listens on a free loopback port, so nothing here touches another Redis on the machine.
Worker ids are `{hostname}.{pid}`, as the workers name themselves.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import TypeAdapter
from redis import Redis
from redis.exceptions import RedisError
from rq.worker import Worker as RQWorker

from shared.observe.fleet import WorkerStats
from shared.queue.config import Settings
from shared.queue.connection import client_for
from shared.queue.keys import Keys
from shared.queue.liveness import slot_name
from worker.gguf.default_model import DEFAULT_MODEL_NAME
from worker.runtime.blas import openblas_env

ROOT = Path(__file__).resolve().parent.parent.parent
WORKER = [sys.executable, "-m", "worker.ops.cli", "worker"]
POOL = [sys.executable, "-m", "worker.ops.cli", "pool"]
RUN = [sys.executable, "-m", "worker.ops.cli", "run"]  # the README's stack (worker/ops/stack.py)
API = [sys.executable, "-m", "gunicorn", "--config", "api/gunicorn_conf.py", "api:create_app()"]
# How long the API may take to answer /health: seconds on a quiet machine, far more on a shared
# 2-core one (measured: over 30 s at a load average of 13).
API_START_S = 120


def _alive(worker: Worker) -> None:
    if worker.proc.poll() is not None:
        raise RuntimeError(f"worker {worker.worker_id} exited: {worker.proc.returncode}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def redis_answers(url: str) -> bool:
    try:
        return bool(client_for(url, socket_connect_timeout=0.5, socket_timeout=0.5).ping())
    except (RedisError, OSError):
        return False


def http_answers(url: str) -> bool:
    """Whether an HTTP server answers at `url` at all (an error status is an answer)."""
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def rss_mb(pid: int) -> float:
    """Resident memory of a process, from /proc (Linux) or ps (macOS)."""
    status = Path(f"/proc/{pid}/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    out = subprocess.run(["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True)
    return int(out.stdout.strip() or 0) / 1024


def environment(**settings: str) -> dict[str, str]:
    """This process's environment plus mlxq settings given as VARIABLE=value.

    The caller's MLXQ_* variables pass through, as `mlxq run` and the benchmarks want; the
    tests take them out of their own environment first (tests/conftest.py)."""
    return {**os.environ, **settings}


def spawn(
    args: list[str],
    env: dict[str, str],
    log: Path | None = None,
    root: Path = ROOT,
    stdin: int | None = None,
) -> subprocess.Popen[bytes]:
    """A process in the project's root (or another checkout's, whose code it then runs); its
    output appended to `log`, or inherited; its stdin a pipe with `stdin=subprocess.PIPE`."""
    if log is None:
        return subprocess.Popen(args, env=env, cwd=root, stdin=stdin)
    with log.open("ab") as out:
        return subprocess.Popen(
            args, env=env, cwd=root, stdin=stdin, stdout=out, stderr=subprocess.STDOUT
        )


def redis_command(
    port: int, data_dir: Path | None = None, extra: list[str] | None = None
) -> list[str]:
    """The redis-server command for 127.0.0.1:`port`: in memory only, or with an append-only
    file in `data_dir`, fsynced every second, so that its data survives a crash or a restart.
    `extra` arguments come last (a password, TLS, more addresses)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found: run scripts/setup.sh or install Redis.")
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    if data_dir is None:
        # Nothing on disk, replication included (a replica's sync would write dump.rdb in cwd).
        args += ["--appendonly", "no", "--repl-diskless-sync", "yes"]
        args += ["--repl-diskless-sync-delay", "0", "--repl-diskless-load", "on-empty-db"]
    else:
        data_dir.mkdir(parents=True, exist_ok=True)
        args += ["--appendonly", "yes", "--appendfsync", "everysec", "--dir", str(data_dir)]
    return args + (extra or [])


def start_redis(
    port: int, data_dir: Path | None = None, extra: list[str] | None = None, url: str = ""
) -> subprocess.Popen[bytes]:
    """A redis-server (`redis_command`); `url` is how to reach it."""
    args = redis_command(port, data_dir, extra)
    # Its own session: a Ctrl-C meant for the caller must not stop Redis under draining workers.
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, start_new_session=True)
    return _answering(server, url or local_url(port), f"Redis on {port}")


def start_sentinel(
    port: int,
    primary_port: int,
    service: str,
    folder: Path,
    down_after_ms: int = 1000,
    extra: list[str] | None = None,
    url: str = "",
) -> subprocess.Popen[bytes]:
    """A Redis Sentinel on 127.0.0.1:`port` watching the primary at 127.0.0.1:`primary_port` as
    `service` (a quorum of 2: three of them make a failover group). It rewrites its config file
    in `folder` as it learns the replicas and the other Sentinels. `extra` config lines come
    last (its own password, the primary's); `url` is how to reach it."""
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "sentinel.conf"
    conf.write_text(
        "\n".join(
            [
                f"port {port}",
                "bind 127.0.0.1",
                f'dir "{folder}"',
                f"sentinel monitor {service} 127.0.0.1 {primary_port} 2",
                f"sentinel down-after-milliseconds {service} {down_after_ms}",
                f"sentinel failover-timeout {service} 10000",
                f"sentinel parallel-syncs {service} 1",
                *(extra or []),
            ]
        )
        + "\n"
    )
    binary = redis_command(port)[0]
    server = subprocess.Popen(
        [binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, start_new_session=True
    )
    return _answering(server, url or local_url(port), f"Sentinel on {port}")


def local_url(port: int) -> str:
    """The URL of a Redis (or Sentinel) started here on 127.0.0.1:`port`."""
    return f"redis://127.0.0.1:{port}/0"


def _answering(server: subprocess.Popen[bytes], url: str, what: str) -> subprocess.Popen[bytes]:
    """`server` once it answers at `url`; stopped, and TimeoutError, if it does not in 10 s."""
    try:
        wait_until(lambda: redis_answers(url), 10, what)
    except TimeoutError:
        stop(server)
        raise
    return server


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 15) -> None:
    """SIGTERM, then SIGKILL if it is still there after `timeout_s`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    reap(proc, timeout_s)


def reap(proc: subprocess.Popen[bytes], timeout_s: float = 15) -> None:
    """Wait for a process told to stop; SIGKILL it after `timeout_s`."""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def children(pid: int) -> list[int]:
    """A process's direct children (the gunicorn workers of an arbiter)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(child) for child in out.stdout.split()]


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    worker_id: str
    env: dict[str, str] = field(default_factory=dict)  # what it was started with, on top

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Cluster:
    """One Redis, at most one API, any number of workers, all under `namespace`.

    `env` goes to every process on top of the cluster's own settings; `logs` is a folder for
    api.log and worker.log (else the processes write to this one's output).
    """

    namespace: str
    heartbeat_s: float = 0.5
    model: str = DEFAULT_MODEL_NAME
    env: dict[str, str] = field(default_factory=dict)
    data_dir: Path | None = None  # Redis keeps an append-only file here, if given
    redis_args: list[str] = field(default_factory=list)  # more: a password, TLS, addresses
    url: str = ""  # how every process reaches Redis; by default redis://127.0.0.1:{port}/0
    logs: Path | None = None
    root: Path = ROOT  # the checkout whose code the API and workers run (a benchmark's "before")
    port: int = field(default_factory=free_port)
    redis_proc: subprocess.Popen[bytes] | None = None
    api_proc: subprocess.Popen[bytes] | None = None
    api_url: str = ""
    more_apis: list[subprocess.Popen[bytes]] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    pools: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def redis_url(self) -> str:
        return self.url or local_url(self.port)

    @property
    def keys(self) -> Keys:
        return Keys(self.namespace)

    def redis(self) -> Redis:
        return client_for(self.redis_url, socket_timeout=2, socket_connect_timeout=1)

    def settings(self) -> Settings:
        """Settings on this cluster's Redis, namespace and heartbeat, for a caller that drives
        its queue directly (a test's or a benchmark's Broker)."""
        return Settings(
            redis_url=self.redis_url, namespace=self.namespace, heartbeat_s=self.heartbeat_s
        )

    def environment(self, **extra: str) -> dict[str, str]:
        own = {
            "REDIS_URL": self.redis_url,
            "MLXQ_NAMESPACE": self.namespace,
            "MLXQ_HEARTBEAT_S": str(self.heartbeat_s),
            "MLXQ_MODEL": self.model,
        }
        return environment(**{**own, **self.env, **extra})

    def _worker_environment(self, env: dict[str, str]) -> dict[str, str]:
        """A worker's environment with OpenBLAS's preload in it already (worker/runtime/blas.py,
        unless MLXQ_OPENBLAS turns it off): a worker that lacks it starts its interpreter again
        to get it, 0.4 s of CPU a start here."""
        own = self.environment(**env)
        if not TypeAdapter(bool).validate_python(own.get("MLXQ_OPENBLAS", True)):
            return own
        return {**own, **openblas_env()}

    def _log(self, name: str) -> Path | None:
        return None if self.logs is None else self.logs / name

    # Redis

    def start_redis(self) -> None:
        self.redis_proc = start_redis(self.port, self.data_dir, self.redis_args, self.redis_url)

    def stop_redis(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.redis_proc is not None:
            self.redis_proc.send_signal(sig)
            self.redis_proc.wait(timeout=30)
            self.redis_proc = None

    # The API

    def start_api(self, **env: str) -> str:
        """The API on a free port; returns its URL. The first is `api_proc` and `api_url`; a
        second one (processes that must agree through Redis) is stopped with the cluster."""
        port = free_port()
        proc_env = self.environment(MLXQ_API_BIND=f"127.0.0.1:{port}", **env)
        proc = spawn(API, proc_env, self._log("api.log"), self.root)
        url = f"http://127.0.0.1:{port}"
        if self.api_proc is None:
            self.api_proc, self.api_url = proc, url
        else:
            self.more_apis.append(proc)
        wait_until(lambda: http_answers(f"{url}/health"), API_START_S, "the API")
        return url

    def api_worker_pids(self) -> list[int]:
        """The gunicorn worker processes (children of the arbiter) that serve requests."""
        assert self.api_proc is not None
        return children(self.api_proc.pid)

    # Workers

    def start_worker(self, wait: bool = True, **env: str) -> Worker:
        proc = spawn(WORKER, self._worker_environment(env), self._log("worker.log"), self.root)
        worker = Worker(proc, f"{socket.gethostname()}.{proc.pid}", dict(env))
        self.workers.append(worker)
        if wait:
            self.wait_for_worker(worker)
        return worker

    def wait_for_worker(self, worker: Worker, timeout_s: float = 180) -> None:
        def registered() -> bool:
            _alive(worker)
            model = worker.env.get("MLXQ_MODEL", self.model)  # a worker may serve another
            try:
                return self.redis().zscore(self.keys.workers(model), worker.worker_id) is not None
            except RedisError:  # Sentinel may call a loaded primary down for a moment
                return False

        wait_until(registered, timeout_s, f"worker {worker.worker_id}")
        wait_until(lambda: self._slots_waiting(worker), timeout_s, f"{worker.worker_id}'s slots")

    def _slots_waiting(self, worker: Worker) -> bool:
        """Every slot the worker announces has started taking jobs. A worker announces itself
        before its slots start (so that it can be reaped): a job queued in between waits for
        them, past a deadline of a second on a loaded machine."""
        _alive(worker)
        try:
            redis = self.redis()
            report = redis.get(self.keys.worker_stats(worker.worker_id))
            if report is None:
                return False
            count = WorkerStats.model_validate_json(report).batch_size
            pipe = redis.pipeline(transaction=False)
            for i in range(count):
                pipe.hget(
                    RQWorker.redis_worker_namespace_prefix + slot_name(worker.worker_id, i), "state"
                )
            return all(state in (b"idle", b"busy") for state in pipe.execute())
        except RedisError:
            return False

    def start_pool(self, **env: str) -> subprocess.Popen[bytes]:
        """A pool agent (worker/pool/agent.py), which starts and stops its own workers; stopped
        with the cluster, its workers draining first."""
        proc = spawn(POOL, self.environment(**env), self._log("pool.log"), self.root)
        self.pools.append(proc)
        return proc

    def kill_worker(self, worker: Worker, sig: signal.Signals = signal.SIGKILL) -> None:
        worker.proc.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            worker.proc.wait(timeout=120)
            self.workers.remove(worker)

    def worker_by_id(self, worker_id: str) -> Worker:
        return next(w for w in self.workers if w.worker_id == worker_id)

    # Everything

    def start(self, workers: int = 1, **worker_env: str) -> Cluster:
        """Redis, then the workers and the API starting side by side; returns when all serve."""
        self.start_redis()
        pending = [self.start_worker(wait=False, **worker_env) for _ in range(workers)]
        self.start_api()
        for worker in pending:
            self.wait_for_worker(worker)
        return self

    def start_api_first(self, workers: int, **worker_env: str) -> Cluster:
        """Redis, the API, then the workers side by side (the benchmarks): many workers starting
        at once on a loaded machine could starve the API's start past its wait."""
        self.start_redis()
        self.start_api()
        pending = [self.start_worker(wait=False, **worker_env) for _ in range(workers)]
        for worker in pending:
            self.wait_for_worker(worker)
        return self

    def stop(self, quick: bool = False) -> None:
        """The workers drain and exit (SIGTERM) beside the API, then Redis is killed.

        The API gets SIGTERM, gunicorn's graceful stop, which waits for its clients' idle
        keep-alive connections to time out (`keepalive` in api/gunicorn_conf.py, 5 s). `quick`
        sends it SIGQUIT, gunicorn's quick stop, instead: for the tests, whose clients keep
        connections open to the end and want no answer from a stack they are done with."""
        apis = [p for p in (self.api_proc, *self.more_apis) if p is not None]
        procs = [w.proc for w in self.workers] + self.pools + apis
        for proc in procs:
            if proc.poll() is None:
                quit_api = quick and any(proc is api for api in apis)
                proc.send_signal(signal.SIGQUIT if quit_api else signal.SIGTERM)
        for proc in procs:
            reap(proc)
        self.workers.clear()
        self.pools.clear()
        self.api_proc = None
        self.more_apis.clear()
        if self.redis_proc is not None and self.redis_proc.poll() is None:
            self.stop_redis(signal.SIGKILL)
