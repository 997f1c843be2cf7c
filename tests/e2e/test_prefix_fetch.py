"""A prompt's prefix cache fetched from the worker that holds it, on real worker processes.

Two workers on the session's Redis, each with a cache folder of its own, as on two machines,
and the same fleet secret. The first answers a conversation's first turn (about 430 tokens),
then a long request fills its only slot. The next turn then goes to the second worker, which has
never seen the conversation: it fetches the first turn's cache from the first worker, whose
lending thread answers while its engine decodes, instead of prefilling it. A worker started
with another secret asks the same way, and refuses what it is sent. Requests go through the
in-process app.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from flask.testing import FlaskClient

from api import create_app
from shared.queue.config import Settings
from tests.support import CHAT, MODEL, NO_END, REAL_ENGINE
from worker.ops.cluster import Cluster, Worker, wait_until

HEARTBEAT_S = 0.5
SECRET = "the fleet's secret"  # every worker's but one test's stranger
# About 400 tokens of system prompt: past the 256 a fetch needs to pay.
SYSTEM = (
    "You answer questions about the weather, the sea and the mountains. You keep every answer "
    "short, you never guess, and when you do not know you say so plainly. "
) * 11


@dataclass
class Fleet:
    http: FlaskClient
    cluster: Cluster
    holder: Worker
    taker: Worker
    folders: dict[str, Path]  # worker id -> its cache folder
    logs: Path  # every worker's output: worker.log


def _ask(http: FlaskClient, messages: list[dict[str, str]], **more: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0, **more}
    reply = http.post(CHAT, json=body)
    assert reply.status_code == 200, reply.get_json()
    answer: dict[str, Any] = reply.get_json()
    return answer


def _files(folder: Path) -> list[list[int]]:
    """The tokens of each cache file under `folder`."""
    found = []
    for path in folder.glob("*/*.safetensors"):
        _, meta = mx.load(str(path), return_metadata=True)
        assert isinstance(meta, dict)
        found.append([int(t) for t in meta["0.tokens"].split(",")])
    return found


@pytest.fixture(scope="module")
def fleet(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    namespace = "mlxqprefixfetch"
    env = {**REAL_ENGINE, "MLXQ_PREFIX_CACHE_DISK_MB": "512", "MLXQ_FLEET_SECRET": SECRET}
    logs = tmp_path_factory.mktemp("logs")
    cluster = Cluster(namespace, HEARTBEAT_S, MODEL, env=env, logs=logs, url=redis_url)
    settings = Settings(redis_url=redis_url, namespace=namespace, heartbeat_s=HEARTBEAT_S)
    folders = [tmp_path_factory.mktemp("holder-cache"), tmp_path_factory.mktemp("taker-cache")]
    try:
        holder = cluster.start_worker(MLXQ_BATCH_SIZE="1", MLXQ_PREFIX_CACHE_DIR=str(folders[0]))
        # The rule's prefill figure raised for the taker alone: on a loaded machine the fetch
        # gets more time than the 1 s this machine's figure would give it.
        taker = cluster.start_worker(
            wait=False,
            MLXQ_BATCH_SIZE="2",
            MLXQ_PREFIX_CACHE_DIR=str(folders[1]),
            MLXQ_PREFILL_S_PER_TOKEN="0.03",
        )
        yield Fleet(
            create_app(settings).test_client(),
            cluster,
            holder,
            taker,
            {holder.worker_id: folders[0], taker.worker_id: folders[1]},
            logs,
        )
    finally:
        cluster.stop()


def _next_turn_while_the_holder_is_busy(
    fleet: Fleet, system: str, elsewhere: Worker
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A conversation's first turn answered by the holder alone, then its next turn while the
    holder's only slot is taken, so that `elsewhere` (started, not yet waited for) takes it."""
    said = [{"role": "system", "content": system}, {"role": "user", "content": "Hello."}]
    first = _ask(fleet.http, said)  # only the holder is serving yet
    fleet.cluster.wait_for_worker(elsewhere)
    redis = fleet.cluster.redis()
    holding = fleet.cluster.keys.taking(fleet.holder.worker_id)
    # The first turn's job may still be on the slot's list for a moment after its answer.
    wait_until(lambda: redis.llen(holding) == 0, 30, "the holder's slot free")
    # It shares the system prompt: placed on the holder, it fills its slot.
    story = [said[0], {"role": "user", "content": "Tell me a long story."}]
    busy = threading.Thread(
        target=_ask,
        args=(fleet.http, story),
        kwargs={"max_tokens": 100, "logit_bias": NO_END},
    )
    busy.start()
    try:
        wait_until(lambda: redis.llen(holding) > 0, 30, "the holder's slot taken")
        answer = first["choices"][0]["message"]["content"]
        turn = [*said, {"role": "assistant", "content": answer}, {"role": "user", "content": "Bye"}]
        second = _ask(fleet.http, turn)
    finally:
        busy.join()
    return first, second


def test_a_busy_holders_cache_is_fetched_by_the_worker_that_takes_the_next_turn(
    fleet: Fleet,
) -> None:
    first, second = _next_turn_while_the_holder_is_busy(fleet, SYSTEM, fleet.taker)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["prompt_tokens"]
    # The taker holds the first turn's cache now, a file it never wrote from its own prefill.
    fetched = _files(fleet.folders[fleet.taker.worker_id])
    assert any(len(tokens) >= first["usage"]["prompt_tokens"] for tokens in fetched)


def test_a_worker_with_another_fleet_secret_refuses_the_cache_it_is_lent(
    fleet: Fleet, tmp_path: Path
) -> None:
    fleet.cluster.kill_worker(fleet.taker, signal.SIGTERM)  # the stranger alone takes the turn
    folder = tmp_path / "stranger-cache"
    stranger = fleet.cluster.start_worker(
        wait=False,
        MLXQ_BATCH_SIZE="2",
        MLXQ_PREFIX_CACHE_DIR=str(folder),
        MLXQ_PREFILL_S_PER_TOKEN="0.03",
        MLXQ_FLEET_SECRET="another fleet's secret",
    )
    # A conversation of its own: none of the first test's caches is any use to it.
    system = SYSTEM.replace("weather", "rivers")
    _, second = _next_turn_while_the_holder_is_busy(fleet, system, stranger)
    # It prefilled the prompt: it asked the holder, was sent the cache and refused it.
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    refused = f"prefix fetch: refused a cache from {fleet.holder.worker_id}: a wrong tag"
    log = fleet.logs / "worker.log"
    wait_until(lambda: refused in log.read_text(errors="replace"), 10, "the refusal's line")
