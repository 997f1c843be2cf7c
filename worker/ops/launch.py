"""Starting mlxq's processes on this machine: a throwaway redis-server, workers, the API.

Used by `mlxq run` and the benchmark; each process is a plain subprocess of the caller.
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
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


def redis_answers(url: str) -> bool:
    try:
        return bool(Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5).ping())
    except (RedisError, OSError):
        return False


def http_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status < 500)
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def start_redis(port: int) -> subprocess.Popen[bytes]:
    """A redis-server on 127.0.0.1:`port` that keeps nothing on disk."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found: run scripts/setup.sh or install Redis.")
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    server = subprocess.Popen([binary, *args], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_until(lambda: redis_answers(url), 10, f"redis-server on port {port}")
    except TimeoutError:
        stop(server)
        raise
    return server


def start_worker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "worker.ops.cli", "worker"], env=env, cwd=ROOT)


def start_api(env: dict[str, str]) -> subprocess.Popen[bytes]:
    """gunicorn on the app factory; MLXQ_API_BIND in `env` says where."""
    args = [sys.executable, "-m", "gunicorn", "--config", "python:api.gunicorn_conf"]
    return subprocess.Popen([*args, "api:create_app()"], env=env, cwd=ROOT)


def environment(**settings: str) -> dict[str, str]:
    """This process's environment plus mlxq settings given as VARIABLE=value."""
    return {**os.environ, **settings}


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 15) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
