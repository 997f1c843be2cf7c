"""A real worker with speculative decoding on (MLXQ_SPECULATION_TOKENS): through HTTP, a request
with OpenAI's `prediction` gets the plain worker's answer word for word, its usage says how many
predicted tokens were kept, and /metrics counts the drafts the worker's batch checked and kept.

One worker process on the session's Redis under a namespace of its own, requests through the
in-process app; the plain worker is the session's stack (speculation off, the shipped default).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from api import create_app
from shared.queue.config import Settings
from tests.support import CHAT, MODEL, REAL_ENGINE
from worker.ops.cluster import Cluster, wait_until

HEARTBEAT_S = 0.5
NAMESPACE = "mlxqspec"
PARAGRAPH = (
    "The market opened at dawn in the square beside the old church. Farmers brought apples, "
    "bread and honey from the valley, and the baker sold warm rolls from a basket by the door."
)


@pytest.fixture(scope="module")
def speculating(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlaskClient]:
    logs = tmp_path_factory.mktemp("logs")
    cluster = Cluster(NAMESPACE, HEARTBEAT_S, MODEL, env=REAL_ENGINE, logs=logs, url=redis_url)
    settings = Settings(redis_url=redis_url, namespace=NAMESPACE, heartbeat_s=HEARTBEAT_S)
    try:
        cluster.start_worker(MLXQ_BATCH_SIZE="4", MLXQ_SPECULATION_TOKENS="5")
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
    speculating: FlaskClient, client: openai.OpenAI
) -> None:
    reply = speculating.post(CHAT, json=_copy_request())
    assert reply.status_code == 200, reply.get_json()
    fast: dict[str, Any] = reply.get_json()
    plain = client.chat.completions.create(**_copy_request())  # the session's plain worker
    assert fast["choices"][0]["message"]["content"] == plain.choices[0].message.content
    assert plain.usage is not None and plain.usage.completion_tokens_details is not None
    assert fast["usage"]["completion_tokens"] == plain.usage.completion_tokens
    details = fast["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > fast["usage"]["completion_tokens"] // 2
    assert plain.usage.completion_tokens_details.accepted_prediction_tokens == 0


def _worker_counter(http: FlaskClient, name: str) -> float:
    text = http.get("/metrics").get_data(as_text=True)
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in (name, f"{name}_total") and sample.labels.get("model_name") == MODEL
    )


def test_metrics_count_the_drafts_the_batch_checked_and_kept(speculating: FlaskClient) -> None:
    assert speculating.post(CHAT, json=_copy_request()).status_code == 200
    drafted = "mlxq:worker_spec_decode_num_draft_tokens"
    kept = "mlxq:worker_spec_decode_num_accepted_tokens"
    wait_until(lambda: _worker_counter(speculating, kept) > 0, 10, "a heartbeat with the drafts")
    assert 0 < _worker_counter(speculating, kept) <= _worker_counter(speculating, drafted)
