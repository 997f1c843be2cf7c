"""Redis restarted under load: the API says 503 while it is down, then everyone carries on.

Point 4 of the fault contract. Redis here keeps no data across the restart (the harshest
case: queues, records and heartbeats are gone); the workers re-announce themselves and their
slots take jobs again without being restarted, nor is the API.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from tests.support import MODEL, Stream, chat_body, post
from worker.ops.cluster import Cluster, wait_until

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def cluster(start_cluster: Callable[..., Cluster]) -> Cluster:
    return start_cluster(env={"MLXQ_BATCH_SIZE": "4"})


def _health(cluster: Cluster) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"{cluster.api_url}/health", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_while_redis_is_down_the_api_answers_503_and_afterwards_all_carry_on(
    cluster: Cluster,
) -> None:
    stream = Stream(cluster.api_url, chat_body(max_tokens=2000))
    stream.read_tokens(1)

    cluster.stop_redis(signal.SIGKILL)
    down = time.monotonic()
    error = json.loads(stream.rest()[-1])
    assert error["error"]["code"] == "backend_unavailable"
    assert time.monotonic() - down < 2.0
    refused = post(cluster.api_url, CHAT, chat_body(max_tokens=4))
    assert refused.status == 503
    assert refused.body["error"]["code"] == "backend_unavailable"
    assert refused.seconds < 2.0
    status, body = _health(cluster)
    assert status == 503
    assert body["error"]["code"] == "backend_unavailable"

    cluster.start_redis()  # same port, empty
    wait_until(lambda: _health(cluster) == (200, {"status": "ok", "models": [MODEL]}), 20, "health")
    # The worker re-subscribes its presence within a beat or so of its heartbeat.
    wait_until(
        lambda: post(cluster.api_url, CHAT, chat_body(max_tokens=1)).status == 200, 5, "a reply"
    )
    reply = post(cluster.api_url, CHAT, chat_body(max_tokens=4))
    assert reply.status == 200, reply.body
    assert reply.body["choices"][0]["finish_reason"] == "length"
    again = Stream(cluster.api_url, chat_body(max_tokens=4))
    assert again.rest()[-1] == "[DONE]"
