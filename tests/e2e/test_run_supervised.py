"""`mlxq run`, the README's run command, keeps the stack up under supervisord and serves its
models through the pool (worker/pool/agent.py): the models of MLXQ_MODELS are loaded as it
starts, a hub id among them as before the pool (from the hub cache); a model dropped into the
models folder is served on its first request, no restart; a worker killed with SIGKILL is loaded
again by the next request, and a killed API is restarted; a model that does not exist is a 404
while the rest keep serving; SIGTERM stops everything.

The stack runs with its own redis-server (started by `mlxq run` itself on a free port), a
models folder of its own, holding the default model under two names (a third dropped in), and
a hub cache of its own that holds it under a hub id, offline."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from redis import Redis

from shared.queue.keys import Keys
from tests.support import MODEL
from worker.ops.cluster import RUN, free_port, spawn, stop, wait_until

SECOND = "smol-second-name"
DROPPED = "smol-dropped-in"
MISSING = "no-such-model"
HUB_ID = "mlxq-tests/smol-from-the-hub"


@dataclass
class Stack:
    proc: subprocess.Popen[bytes]
    log: Path
    models: Path
    api_url: str
    redis: Redis
    keys: Keys

    def said(self, text: str) -> bool:
        return text in self.log.read_text(errors="replace")

    def answers(self, model: str) -> bool:
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        try:
            reply = httpx.post(f"{self.api_url}/v1/chat/completions", json=body, timeout=60)
        except httpx.HTTPError:
            return False
        return reply.status_code == 200

    def worker_pid(self, model: str) -> int:
        """The pid of the worker with the latest heartbeat for `model` (a dead one's entry
        stays until a live worker reaps it)."""
        ((worker_id, _),) = self.redis.zrange(self.keys.workers(model), -1, -1, withscores=True)
        return int(worker_id.decode().rsplit(".", 1)[1])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("run")
    models = folder / "models"
    models.mkdir()
    real = Path.home() / ".cache" / "mlxq" / "models" / MODEL
    for name in (MODEL, SECOND):
        (models / name).symlink_to(real)
    (models / ".native").symlink_to(real.parent / ".native")  # the CPU matvec, built once
    hub = folder / "hub"
    repo = hub / f"models--{HUB_ID.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    (repo / "snapshots").mkdir()
    (repo / "snapshots" / ("0" * 40)).symlink_to(real)
    redis_port, api_port = free_port(), free_port()
    env = dict(
        os.environ,
        REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
        MLXQ_REDIS_DIR=str(folder / "redis"),
        MLXQ_NAMESPACE="mlxqrun",
        MLXQ_MODELS_DIR=str(models),
        MLXQ_MODELS=f"{MODEL},{SECOND},{MISSING},{HUB_ID}",
        HF_HUB_CACHE=str(hub),
        HF_HUB_OFFLINE="1",
        MLXQ_API_BIND=f"127.0.0.1:{api_port}",
        MLXQ_HEARTBEAT_S="0.5",
        MLXQ_BATCH_SIZE="2",
        # Four chat models held at once (one dropped in): each a window's KV, not a fifth of
        # the machine's budget, so that none is evicted for another.
        MLXQ_POOL_KV_TOKENS="8192",
    )
    log = folder / "run.log"
    proc = spawn(RUN, env, log)
    redis = Redis.from_url(env["REDIS_URL"], socket_timeout=2)
    running = Stack(proc, log, models, f"http://127.0.0.1:{api_port}", redis, Keys("mlxqrun"))
    try:
        wait_until(lambda: running.answers(MODEL) and running.answers(SECOND), 240, "the stack")
        yield running
    finally:
        stop(proc, timeout_s=90)


def test_the_models_of_mlxq_models_are_loaded_as_the_pool_starts(stack: Stack) -> None:
    def states() -> dict[str, str]:
        listed = httpx.get(f"{stack.api_url}/v1/models", timeout=10).json()
        return {m["id"]: m["status"]["value"] for m in listed["data"]}

    loaded = {MODEL: "loaded", SECOND: "loaded", HUB_ID: "loaded"}
    wait_until(lambda: states() == loaded, 60, "every model of MLXQ_MODELS loaded")


def test_a_hub_id_in_mlxq_models_is_served_under_its_id(stack: Stack) -> None:
    wait_until(lambda: stack.answers(HUB_ID), 60, "the hub model's answer")


def test_a_model_dropped_into_the_models_folder_is_served_on_its_first_request(
    stack: Stack,
) -> None:
    (stack.models / DROPPED).symlink_to(stack.models / MODEL)
    wait_until(lambda: stack.answers(DROPPED), 180, "the dropped-in model's first answer")


def test_a_killed_worker_is_loaded_again_by_the_next_request(stack: Stack) -> None:
    victim = stack.worker_pid(MODEL)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: stack.answers(MODEL), 180, "a request served by a new worker")
    assert stack.worker_pid(MODEL) != victim
    assert stack.answers(SECOND)  # the other model's worker never stopped


def test_a_killed_api_is_restarted(stack: Stack) -> None:
    gunicorn = int(
        subprocess.run(
            ["pgrep", "-f", "gunicorn.*api.gunicorn_conf", "-P", str(_supervisord(stack))],
            capture_output=True,
            text=True,
        ).stdout.split()[0]
    )
    os.kill(gunicorn, signal.SIGKILL)
    wait_until(lambda: stack.said("exited: web (terminated by SIGKILL; not expected)"), 10, "")
    wait_until(lambda: stack.answers(MODEL), 60, "a request served by the restarted API")


def test_a_model_that_does_not_exist_is_a_404_and_the_rest_serve(stack: Stack) -> None:
    body = {"model": MISSING, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    reply = httpx.post(f"{stack.api_url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 404
    assert stack.answers(MODEL) and stack.answers(SECOND)


def test_sigterm_stops_everything(stack: Stack) -> None:
    supervisord = _supervisord(stack)
    stack.proc.send_signal(signal.SIGTERM)
    assert stack.proc.wait(timeout=90) == 0
    assert subprocess.run(["pgrep", "-P", str(supervisord)], capture_output=True).stdout == b""
    assert stack.said("stopped: web") and stack.said("stopped: pool")


def _supervisord(stack: Stack) -> int:
    out = subprocess.run(["pgrep", "-P", str(stack.proc.pid)], capture_output=True, text=True)
    pids = [int(p) for p in out.stdout.split()]
    for pid in pids:
        if "supervisord" in Path(f"/proc/{pid}/cmdline").read_text():
            return pid
    raise AssertionError(f"no supervisord among {pids}")
