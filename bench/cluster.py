"""A local cluster of real processes, for the fault tests and the soak: a private redis-server
on its own port, the API under gunicorn, and worker processes, each started, killed, stopped
and restarted on demand.

Nothing here is shared with anything else running on the machine: the Redis port is free and
private, and every process gets the cluster's namespace and environment. Worker ids are
`{hostname}.{pid}`, as the workers name themselves.
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
from typing import IO

from redis import Redis

from shared.keys import Keys

ROOT = Path(__file__).resolve().parent.parent
MODEL = "SmolLM2-135M-Instruct"


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


def rss_mb(pid: int) -> float:
    """Resident memory of a process, from /proc (Linux) or ps (macOS)."""
    status = Path(f"/proc/{pid}/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    out = subprocess.run(["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True)
    return int(out.stdout.strip() or 0) / 1024


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
    """One Redis, at most one API, any number of workers, all under `namespace`."""

    namespace: str
    heartbeat_s: float = 0.5
    env: dict[str, str] = field(default_factory=dict)
    # Keep Redis's data across a restart (append-only file in `data_dir`), as a real queue would.
    persistent: bool = False
    data_dir: Path | None = None
    log: IO[bytes] | None = None
    port: int = field(default_factory=free_port)
    redis_proc: subprocess.Popen[bytes] | None = None
    api_proc: subprocess.Popen[bytes] | None = None
    api_url: str = ""
    workers: list[Worker] = field(default_factory=list)

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def keys(self) -> Keys:
        return Keys(self.namespace)

    def redis(self) -> Redis:
        return Redis.from_url(self.redis_url, socket_timeout=2, socket_connect_timeout=1)

    def environment(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            REDIS_URL=self.redis_url,
            MLXQ_NAMESPACE=self.namespace,
            MLXQ_HEARTBEAT_S=str(self.heartbeat_s),
            MLXQ_MODEL=MODEL,
        )
        env.update(self.env)
        env.update(extra)
        return env

    def _spawn(self, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        out = self.log if self.log is not None else None
        return subprocess.Popen(args, env=env, cwd=ROOT, stdout=out, stderr=out)

    # Redis

    def start_redis(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is required (scripts/setup.sh installs it)"
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        if self.persistent:
            assert self.data_dir is not None
            self.data_dir.mkdir(parents=True, exist_ok=True)
            args += ["--appendonly", "yes", "--dir", str(self.data_dir)]
        else:
            args += ["--appendonly", "no"]
        self.redis_proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        wait_until(self._redis_answers, 10, "redis-server")

    def _redis_answers(self) -> bool:
        try:
            return bool(Redis.from_url(self.redis_url, socket_timeout=0.5).ping())
        except Exception:
            return False

    def stop_redis(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.redis_proc is not None:
            self.redis_proc.send_signal(sig)
            self.redis_proc.wait(timeout=30)
            self.redis_proc = None

    # The API

    def start_api(self, **env: str) -> str:
        port = free_port()
        args = [sys.executable, "-m", "gunicorn", "--config", "python:api.gunicorn_conf"]
        proc_env = self.environment(MLXQ_API_BIND=f"127.0.0.1:{port}", **env)
        self.api_proc = self._spawn([*args, "api:create_app()"], proc_env)
        self.api_url = f"http://127.0.0.1:{port}"
        wait_until(self._api_answers, 30, "the API")
        return self.api_url

    def _api_answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.api_url}/health", timeout=1) as response:
                return bool(response.status == 200)
        except urllib.error.HTTPError:
            return True  # it answers, even if only to say Redis is down
        except OSError:
            return False

    def api_worker_pids(self) -> list[int]:
        """The gunicorn worker processes (children of the arbiter) that serve requests."""
        assert self.api_proc is not None
        out = subprocess.run(
            ["pgrep", "-P", str(self.api_proc.pid)], capture_output=True, text=True
        )
        return [int(pid) for pid in out.stdout.split()]

    # Workers

    def start_worker(self, wait: bool = True, **env: str) -> Worker:
        args = [sys.executable, "-m", "worker.ops.cli", "worker"]
        proc = self._spawn(args, self.environment(**env))
        worker = Worker(proc, f"{socket.gethostname()}.{proc.pid}", dict(env))
        self.workers.append(worker)
        if wait:
            self.wait_for_worker(worker)
        return worker

    def wait_for_worker(self, worker: Worker, timeout_s: float = 120) -> None:
        def registered() -> bool:
            if worker.proc.poll() is not None:
                raise RuntimeError(f"worker {worker.worker_id} exited: {worker.proc.returncode}")
            return self.redis().zscore(self.keys.workers(MODEL), worker.worker_id) is not None

        wait_until(registered, timeout_s, f"worker {worker.worker_id}")

    def kill_worker(self, worker: Worker, sig: signal.Signals = signal.SIGKILL) -> None:
        worker.proc.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            worker.proc.wait(timeout=120)
            self.workers.remove(worker)

    def worker_by_id(self, worker_id: str) -> Worker:
        return next(w for w in self.workers if w.worker_id == worker_id)

    # Everything

    def start(self, workers: int = 1, **worker_env: str) -> Cluster:
        self.start_redis()
        pending = [self.start_worker(wait=False, **worker_env) for _ in range(workers)]
        self.start_api()
        for worker in pending:
            self.wait_for_worker(worker)
        return self

    def stop(self) -> None:
        procs = [w.proc for w in self.workers]
        procs += [p for p in (self.api_proc,) if p is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.workers.clear()
        self.api_proc = None
        if self.redis_proc is not None and self.redis_proc.poll() is None:
            self.stop_redis(signal.SIGKILL)
