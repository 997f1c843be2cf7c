"""Fixtures on real parts: a private redis-server, a real worker on the real default model,
the API under gunicorn, and the OpenAI SDK pointed at it.

Everything is started once per test session on free ports, under a test namespace; the
Redis at 127.0.0.1:6379 that a machine may run is never touched.
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
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from flask import Flask
from flask.testing import FlaskClient
from redis import Redis

from api import create_app
from shared.config import Settings
from shared.keys import Keys

ROOT = Path(__file__).resolve().parent.parent
MODEL = "SmolLM2-135M-Instruct"
NAMESPACE = "mlxqtest"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    binary = shutil.which("redis-server")
    assert binary, "redis-server is required (scripts/setup.sh installs it)"
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    wait_until(lambda: _pings(url), 10, "redis-server")
    yield url
    _stop(proc)


def _pings(url: str) -> bool:
    try:
        return bool(Redis.from_url(url, socket_timeout=0.5).ping())
    except Exception:
        return False


@pytest.fixture(scope="session")
def settings(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url, namespace=NAMESPACE, heartbeat_s=0.5, model=MODEL)


@pytest.fixture(scope="session")
def redis(settings: Settings) -> Redis:
    return Redis.from_url(settings.redis_url)


def service_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        REDIS_URL=settings.redis_url,
        MLXQ_NAMESPACE=settings.namespace,
        MLXQ_HEARTBEAT_S=str(settings.heartbeat_s),
        MLXQ_MODEL=settings.model,
        **extra,
    )
    return env


@pytest.fixture(scope="session")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the session's worker and API write their output (worker.log, api.log)."""
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def worker_process(
    settings: Settings, redis: Redis, logs: Path
) -> Iterator[subprocess.Popen[bytes]]:
    env = service_env(settings, MLXQ_BATCH_SIZE="8")
    with (logs / "worker.log").open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker.ops.cli", "worker"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    keys = Keys(settings.namespace)
    wait_until(lambda: redis.zscore(keys.models(), MODEL) is not None, 180, "the worker")
    yield proc
    _stop(proc)


@pytest.fixture(scope="session")
def api_url(settings: Settings, logs: Path) -> Iterator[str]:
    port = free_port()
    env = service_env(settings, MLXQ_API_BIND=f"127.0.0.1:{port}")
    args = [sys.executable, "-m", "gunicorn", "--config", "python:api.gunicorn_conf"]
    with (logs / "api.log").open("ab") as out:
        proc = subprocess.Popen(
            [*args, "api:create_app()"], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _answers(url), 30, "the API")
    yield url
    _stop(proc)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError:
        return True  # it answers, even if only to say Redis is down
    except OSError:
        return False


@pytest.fixture(scope="session")
def client(api_url: str, worker_process: subprocess.Popen[bytes]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def app(settings: Settings) -> Flask:
    return create_app(settings)


@pytest.fixture
def http(app: Flask) -> FlaskClient:
    return app.test_client()
