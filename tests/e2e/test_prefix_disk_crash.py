"""The prefix cache's disk tier across a crash, on real worker processes: a cache is written soon
after it is made (write-behind), so a worker killed with SIGKILL, which writes nothing as it dies,
leaves it behind, and the worker started in its place serves the same prompt from the file.

One worker, then its replacement, on the session's Redis under a namespace of their own; requests
go through the in-process app.
"""

from __future__ import annotations

import secrets
import signal
from typing import Any

import pytest

from api import create_app
from shared.queue.config import Settings
from tests.support import CHAT, MODEL, REAL_ENGINE
from worker.engine.prefix_file import held_lengths
from worker.ops.cluster import Cluster, wait_until

HEARTBEAT_S = 0.5
# About 640 tokens of the default model: a document the user asks about.
DOCUMENT = (
    "The harbour master keeps a ledger of every ship that enters the bay, the tide it came in "
    "on, the cargo it declared and the berth it was given. "
) * 18
WRITTEN_WITHIN_S = 30.0  # the write-behind of a ~30 MB cache, on a loaded machine


def _ask(http: Any, nonce: str) -> dict[str, Any]:
    content = f"Document {nonce}. {DOCUMENT}\nWhat does the ledger record?"
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "temperature": 0,
    }
    reply = http.post(CHAT, json=body)
    assert reply.status_code == 200, reply.get_json()
    answer: dict[str, Any] = reply.get_json()
    return answer


def test_a_prompt_seen_before_a_kill_9_is_served_from_disk_by_the_next_worker(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("prefix-cache")
    env = {**REAL_ENGINE, "MLXQ_PREFIX_CACHE_DIR": str(root), "MLXQ_PREFIX_CACHE_DISK_MB": "512"}
    namespace = "mlxqprefixcrash"
    logs = tmp_path_factory.mktemp("logs")
    cluster = Cluster(namespace, HEARTBEAT_S, MODEL, env=env, logs=logs, url=redis_url)
    settings = Settings(redis_url=redis_url, namespace=namespace, heartbeat_s=HEARTBEAT_S)
    http = create_app(settings).test_client()
    nonce = secrets.token_hex(4)
    try:
        first = cluster.start_worker()
        cold = _ask(http, nonce)
        prompt = cold["usage"]["prompt_tokens"]
        wait_until(
            lambda: max(held_lengths(root).values(), default=0) >= prompt,
            WRITTEN_WITHIN_S,
            "the write-behind",
        )
        cluster.kill_worker(first, signal.SIGKILL)  # no shutdown: nothing written as it dies
        cluster.start_worker()
        again = _ask(http, nonce)
    finally:
        cluster.stop()
    assert again["usage"]["prompt_tokens"] == prompt > 600
    # All of it but the last token, recomputed for the logits.
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt - 1
