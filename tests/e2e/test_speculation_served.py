"""Speculative decoding as shipped (MLXQ_SPECULATION_TOKENS, on by default): through HTTP, a
request with OpenAI's `prediction` gets the answer a worker without speculation gives, word for
word; its usage says how many predicted tokens were kept; /metrics counts the drafts the
worker's batch checked and kept.

The speculating worker is the session's stack (the shipped defaults, through the OpenAI SDK);
the plain one is a worker of this module's with MLXQ_SPECULATION_TOKENS=0, on the session's
Redis under a namespace of its own, asked through the in-process app.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from api import create_app
from shared.queue.config import Settings
from tests.support import CHAT, MODEL, REAL_ENGINE
from worker.ops.cluster import Cluster, wait_until

HEARTBEAT_S = 0.5
NAMESPACE = "mlxqnospec"
PARAGRAPH = (
    "The market opened at dawn in the square beside the old church. Farmers brought apples, "
    "bread and honey from the valley, and the baker sold warm rolls from a basket by the door."
)


@pytest.fixture(scope="module")
def plain(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlaskClient]:
    logs = tmp_path_factory.mktemp("logs")
    cluster = Cluster(NAMESPACE, HEARTBEAT_S, MODEL, env=REAL_ENGINE, logs=logs, url=redis_url)
    settings = Settings(redis_url=redis_url, namespace=NAMESPACE, heartbeat_s=HEARTBEAT_S)
    try:
        cluster.start_worker(MLXQ_BATCH_SIZE="4", MLXQ_SPECULATION_TOKENS="0")
        yield create_app(settings).test_client()
    finally:
        cluster.stop()


def _copy_request() -> dict[str, Any]:
    ask = f"Repeat the following text exactly, word for word:\n\n{PARAGRAPH}"
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": ask}],
        "max_tokens": 48,
        "temperature": 0,
        "prediction": {"type": "content", "content": PARAGRAPH},
    }


def test_a_predicted_answer_is_the_plain_workers_word_for_word_and_usage_counts_the_kept(
    plain: FlaskClient, client: openai.OpenAI
) -> None:
    fast = client.chat.completions.create(**_copy_request())  # the shipped, speculating worker
    reply = plain.post(CHAT, json=_copy_request())
    assert reply.status_code == 200, reply.get_json()
    slow: dict[str, Any] = reply.get_json()
    assert fast.choices[0].message.content == slow["choices"][0]["message"]["content"]
    assert fast.usage is not None and fast.usage.completion_tokens_details is not None
    assert fast.usage.completion_tokens == slow["usage"]["completion_tokens"]
    kept = fast.usage.completion_tokens_details.accepted_prediction_tokens
    assert kept is not None and kept > fast.usage.completion_tokens // 2
    assert slow["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] == 0


def _worker_counter(api_url: str, name: str) -> float:
    text = httpx.get(f"{api_url}/metrics", timeout=30).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in (name, f"{name}_total") and sample.labels.get("model_name") == MODEL
    )


def test_metrics_count_the_drafts_the_batch_checked_and_kept(
    client: openai.OpenAI, api_url: str
) -> None:
    kept = "mlxq:worker_spec_decode_num_accepted_tokens"
    drafted = "mlxq:worker_spec_decode_num_draft_tokens"
    before = _worker_counter(api_url, kept)
    client.chat.completions.create(**_copy_request())
    wait_until(lambda: _worker_counter(api_url, kept) > before, 10, "a heartbeat with the drafts")
    assert 0 < _worker_counter(api_url, kept) <= _worker_counter(api_url, drafted)
