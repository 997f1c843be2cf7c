"""Anthropic's Message Batches through its SDK on the real stack: requests run as batch lines on
the model's batch queue and come back as results by custom_id (succeeded, errored, canceled)."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import anthropic
import pytest
from anthropic.types.messages import MessageBatch

from tests.support import MODEL, STORY

FRANCE: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def claude(api_url: str, worker_process: subprocess.Popen[bytes]) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=api_url, api_key="unused", max_retries=0, timeout=120)


def wait_ended(claude: anthropic.Anthropic, batch_id: str, timeout_s: float = 180) -> MessageBatch:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = claude.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.processing_status}"
        time.sleep(0.25)


def params(**extra: Any) -> Any:
    return {"model": MODEL, "max_tokens": 32, "messages": FRANCE, "temperature": 0, **extra}


def test_a_message_batch_answers_each_request_by_custom_id(claude: anthropic.Anthropic) -> None:
    batch = claude.messages.batches.create(
        requests=[
            {"custom_id": "france", "params": params()},
            {"custom_id": "short", "params": params(max_tokens=3)},
            {"custom_id": "bad", "params": params(max_tokens=0)},
        ]
    )
    assert batch.id.startswith("msgbatch_") and batch.type == "message_batch"
    assert batch.processing_status == "in_progress" and batch.results_url is None
    ended = wait_ended(claude, batch.id)
    counts = ended.request_counts
    assert (counts.succeeded, counts.errored, counts.processing) == (2, 1, 0)
    assert ended.ended_at is not None and ended.results_url
    results = {r.custom_id: r.result for r in claude.messages.batches.results(batch.id)}
    assert set(results) == {"france", "short", "bad"}
    france, short, bad = results["france"], results["short"], results["bad"]
    assert france.type == "succeeded" and short.type == "succeeded" and bad.type == "errored"
    assert "Paris" in "".join(b.text for b in france.message.content if b.type == "text")
    assert france.message.id.startswith("msg_") and france.message.stop_reason == "end_turn"
    assert short.message.stop_reason == "max_tokens" and short.message.usage.output_tokens == 3
    assert bad.error.error.type == "invalid_request_error"
    assert "max_tokens" in bad.error.error.message
    assert batch.id in [b.id for b in claude.messages.batches.list(limit=100)]


def test_a_cancelled_message_batch_ends_with_canceled_requests(
    claude: anthropic.Anthropic,
) -> None:
    long = params(messages=STORY, max_tokens=400)
    requests: Any = [{"custom_id": f"r{i}", "params": long} for i in range(6)]
    batch = claude.messages.batches.create(requests=requests)
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.batches.delete(batch.id)  # only an ended batch can be deleted
    cancelling = claude.messages.batches.cancel(batch.id)
    assert cancelling.processing_status in ("canceling", "ended")
    assert cancelling.cancel_initiated_at is not None
    ended = wait_ended(claude, batch.id)
    kinds = [r.result.type for r in claude.messages.batches.results(batch.id)]
    assert len(kinds) == 6 and set(kinds) <= {"succeeded", "canceled"}
    assert ended.request_counts.canceled == kinds.count("canceled") >= 1
    deleted = claude.messages.batches.delete(batch.id)
    assert (deleted.id, deleted.type) == (batch.id, "message_batch_deleted")
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.batches.retrieve(batch.id)


def test_a_batch_with_a_repeated_custom_id_is_refused_whole(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.batches.create(requests=[{"custom_id": "same", "params": params()}] * 2)
    assert "same" in caught.value.message
