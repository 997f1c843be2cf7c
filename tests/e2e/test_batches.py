"""Files and the Batch API through the OpenAI SDK, on the real worker and model."""

from __future__ import annotations

import json
import time

import openai
from redis import Redis

from shared.observe.fleet import read_snapshot
from shared.observe.metrics import JobRecord
from shared.queue.config import Settings
from shared.queue.keys import Keys
from shared.wire.batch.batches import StoredBatch
from tests.support import (
    CHAT,
    MODEL,
    NO_END,
    chat_line,
    lines_of,
    recent_jobs,
    start_batch,
    wait_batch,
)
from worker.ops.cluster import wait_until

# A batch line (120 tokens) runs for seconds; one that ended this soon after a request was queued
# was already finishing when it came.
ENDING_S = 0.5


def test_files_round_trip(client: openai.OpenAI) -> None:
    data = b'{"a": 1}\n{"b": 2}\n'
    created = client.files.create(file=("mine.jsonl", data), purpose="batch")
    assert (created.bytes, created.filename, created.purpose) == (len(data), "mine.jsonl", "batch")
    assert client.files.retrieve(created.id).id == created.id
    assert client.files.content(created.id).content == data
    assert created.id in [f.id for f in client.files.list()]
    assert client.files.delete(created.id).deleted is True
    try:
        client.files.retrieve(created.id)
        raise AssertionError("a deleted file is still there")
    except openai.NotFoundError:
        pass


def test_batch_round_trip_in_input_order(client: openai.OpenAI) -> None:
    lines = [
        chat_line(f"q{i}", f"What is {i} plus {i}?", max_tokens=8, temperature=0) for i in range(4)
    ]
    batch = start_batch(client, lines)
    assert batch.status == "in_progress"
    assert batch.request_counts is not None and batch.request_counts.total == 4
    done = wait_batch(client, batch.id)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (4, 0)
    assert done.completed_at is not None and done.finalizing_at is not None
    assert done.error_file_id is None
    out = lines_of(client, done.output_file_id)
    assert [o["custom_id"] for o in out] == ["q0", "q1", "q2", "q3"]
    first = out[0]["response"]
    assert first["status_code"] == 200 and out[0]["error"] is None
    assert first["body"]["object"] == "chat.completion"
    direct = client.chat.completions.create(
        model=MODEL, messages=lines[0]["body"]["messages"], max_tokens=8, temperature=0
    )
    assert first["body"]["choices"][0]["message"]["content"] == direct.choices[0].message.content
    assert done.usage is not None and done.usage.output_tokens > 0
    assert batch.id in [b.id for b in client.batches.list(limit=100)]


def test_a_bad_line_fails_alone(client: openai.OpenAI) -> None:
    lines = [
        chat_line("good-1", "Hi", max_tokens=4),
        chat_line("bad", "Hi", temperature=7),
        chat_line("good-2", "Hello", max_tokens=4),
        chat_line("streamed", "Hi", stream=True),
    ]
    done = wait_batch(client, start_batch(client, lines).id)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 2)
    assert [o["custom_id"] for o in lines_of(client, done.output_file_id)] == ["good-1", "good-2"]
    errors = {e["custom_id"]: e for e in lines_of(client, done.error_file_id)}
    assert set(errors) == {"bad", "streamed"}
    bad = errors["bad"]["response"]
    assert bad["status_code"] == 400
    assert bad["body"]["error"]["param"] == "temperature"
    assert errors["streamed"]["response"]["body"]["error"]["param"] == "stream"


def test_completions_and_responses_endpoints(client: openai.OpenAI) -> None:
    completion = {
        "model": MODEL,
        "prompt": "The capital of France is",
        "max_tokens": 3,
        "temperature": 0,
    }
    lines = [{"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": completion}]
    done = wait_batch(client, start_batch(client, lines, "/v1/completions").id)
    body = lines_of(client, done.output_file_id)[0]["response"]["body"]
    assert body["object"] == "text_completion" and "Paris" in body["choices"][0]["text"]
    response = {"model": MODEL, "input": "What is the capital of France?", "temperature": 0}
    lines = [{"custom_id": "r", "method": "POST", "url": "/v1/responses", "body": response}]
    done = wait_batch(client, start_batch(client, lines, "/v1/responses").id)
    body = lines_of(client, done.output_file_id)[0]["response"]["body"]
    assert body["object"] == "response" and body["status"] == "completed"
    assert "Paris" in body["output"][0]["content"][0]["text"]


def test_a_batch_failing_validation_names_each_problem(client: openai.OpenAI) -> None:
    good = chat_line("a", "Hi")
    lines = (
        "\n".join(
            [
                json.dumps(good),
                json.dumps(chat_line("a", "Hi again")),
                "this is not json",
                json.dumps({**chat_line("c", "Hi"), "url": "/v1/completions"}),
                json.dumps(
                    chat_line("d", "Hi") | {"body": {"model": "nobody-serves-this", "messages": []}}
                ),
                json.dumps({"custom_id": "e", "url": CHAT}),
            ]
        )
        + "\n"
    ).encode()
    batch = start_batch(client, lines)
    assert batch.status == "failed"
    assert batch.failed_at is not None
    assert batch.errors is not None and batch.errors.data is not None
    found = {(e.code, e.line) for e in batch.errors.data}
    assert found == {
        ("duplicate_custom_id", 2),
        ("invalid_json_line", 3),
        ("invalid_url", 4),
        ("model_not_found", 5),
        ("invalid_request", 6),
    }
    assert client.batches.retrieve(batch.id).status == "failed"
    empty = start_batch(client, b"\n")
    assert empty.status == "failed"
    assert empty.errors is not None and empty.errors.data is not None
    assert empty.errors.data[0].code == "empty_file"


def test_cancel_while_running(client: openai.OpenAI) -> None:
    short = [chat_line(f"s{i}", "Hi", max_tokens=2) for i in range(2)]
    long = [
        chat_line(f"s{i}", "Write a long story about a cat.", max_tokens=2000) for i in range(2, 10)
    ]
    batch = start_batch(client, short + long)
    deadline = time.monotonic() + 60
    while client.batches.retrieve(batch.id).request_counts.completed == 0:  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait_batch(client, batch.id, timeout_s=30)
    assert done.status == "cancelled" and done.cancelled_at is not None
    out = lines_of(client, done.output_file_id)
    errors = lines_of(client, done.error_file_id)
    assert sorted(o["custom_id"] for o in out + errors) == sorted(f"s{i}" for i in range(10))
    assert errors and all(e["error"]["code"] == "batch_cancelled" for e in errors)
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (len(out), len(errors))
    assert client.batches.cancel(batch.id).status == "cancelled"  # idempotent


def test_a_batch_past_its_window_expires_with_its_unfinished_lines(
    client: openai.OpenAI, settings: Settings, redis: Redis
) -> None:
    short = [chat_line(f"x{i}", "Hi", max_tokens=2) for i in range(2)]
    long = [chat_line(f"x{i}", "Write a long story.", max_tokens=2000) for i in range(2, 8)]
    batch = start_batch(client, short + long)
    deadline = time.monotonic() + 60
    while client.batches.retrieve(batch.id).request_counts.completed < 2:  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    key = Keys(settings.namespace).batch(batch.id)
    record = StoredBatch.model_validate_json(redis.hget(key, "record"))  # type: ignore[arg-type]
    record.expires_at = int(time.time()) - 1  # as if 24 hours had passed
    redis.hset(key, "record", record.model_dump_json())
    done = client.batches.retrieve(batch.id)  # a small batch: this read finalizes it
    assert done.status == "expired" and done.expired_at is not None
    out = lines_of(client, done.output_file_id)
    errors = lines_of(client, done.error_file_id)
    assert [o["custom_id"] for o in out][:2] == ["x0", "x1"]
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    assert len(out) + len(errors) == 8


def test_interactive_requests_do_not_wait_behind_a_batch(
    client: openai.OpenAI, settings: Settings, redis: Redis
) -> None:
    # The fleet's view is a heartbeat old: the lane can look full just as a wave of lines has
    # ended, the request then finding a free slot. Such a try proves nothing and is made again.
    for _ in range(3):
        tried = _request_while_the_batch_is_full(client, settings, redis)
        if tried is not None:
            break
    else:
        raise AssertionError("no request came while the batch held every bulk slot")
    asked, running = tried
    # It started before any line running when it was queued had ended: it took a reserved
    # slot, where behind the batch it would have started only as one of them ended. A line
    # that ended within ENDING_S of that moment was already finishing as the request came
    # (one ended 1.2 ms after it once, the request starting 4 ms after): it is left out.
    ending = [j for j in running if j.ended_at > asked.enqueued_at + ENDING_S]
    # Where every line ended that soon (the lines of a wave end together), it started as soon.
    assert asked.started_at < min(
        (j.ended_at for j in ending), default=asked.enqueued_at + ENDING_S
    )


def _request_while_the_batch_is_full(
    client: openai.OpenAI, settings: Settings, redis: Redis
) -> tuple[JobRecord, list[JobRecord]] | None:
    """Stream a request while a batch seems to hold every bulk slot with lines waiting; its
    record and those of the lines running as it was queued, or None where fewer were."""
    keys = Keys(settings.namespace)
    lines = [
        # Every line runs its 120 tokens (no end token), so none frees a slot early.
        chat_line(f"b{i}", "Write a long story about a dog.", max_tokens=120, logit_bias=NO_END)
        for i in range(24)
    ]
    batch = start_batch(client, lines)
    # Other modules' workers of other models may have served on the session stack before.
    (worker,) = [
        w for w in read_snapshot(redis, keys, settings.heartbeat_s).workers if w.model == MODEL
    ]
    bulk_slots = worker.batch_size - settings.interactive_slots

    def lanes() -> dict[str, tuple[int, int]]:
        (model,) = [
            m for m in read_snapshot(redis, keys, settings.heartbeat_s).models if m.model == MODEL
        ]
        return {lane.lane: (lane.running, lane.waiting) for lane in model.lanes}

    def holds_every_bulk_slot() -> bool:
        running, waiting = lanes()["batch"]
        return running >= bulk_slots and waiting > 0

    wait_until(holds_every_bulk_slot, 60, "the batch to hold every bulk slot, lines waiting")
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True
    )
    first = next(iter(stream))
    list(stream)
    assert first.choices[0].delta.role == "assistant"
    client.batches.cancel(batch.id)
    assert wait_batch(client, batch.id, timeout_s=30).status == "cancelled"
    # A job is recorded as it ends, before its slot is free: once the heartbeat shows no line
    # running, every line's record is there.
    wait_until(lambda: lanes()["batch"][0] == 0, 30, "the cancelled lines to end")
    jobs = recent_jobs(redis, settings)
    (asked,) = [j for j in jobs if j.job_id == first.id]
    queued = asked.enqueued_at
    running = [j for j in jobs if j.lane == "batch" and j.started_at < queued < j.ended_at]
    return (asked, running) if len(running) >= bulk_slots else None
