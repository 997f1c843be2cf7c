"""A batch's finalization off the request path (api/stores/batch_finalize.py), on the in-process
app, a real Redis, real intake and finalizer processes, and a stand-in worker that takes nothing:
the test records each line's answer as a worker does (worker/runtime/kinds/batch_lines.py).

A read of a due batch answers `finalizing` at once while a process of its own writes the files;
the batch then ends with the files the lines' answers make, in input order, each written a chunk
at a time (MLXQ_FILE_CHUNK_BYTES, small here, so that it takes several) and downloaded byte for
byte; a message batch's results then stream.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from redis import Redis
from redis.client import PubSub

from api.http.auth import ANONYMOUS
from api.stores.batch_finalize import (
    INLINE_BYTES,
    PAGE_LINES,
    FinalizeOrder,
    Finalizer,
    LockLost,
)
from shared.queue.jobs import GenerationJob
from shared.queue.keys import Keys
from shared.wire.batch.batches import BatchOutputLine, LineResult, StoredBatch
from tests.api.test_files_in_chunks import chunks_kept, download
from tests.support import (
    CHAT,
    MODEL,
    SMALL_CHUNK,
    chat_line,
    ended_message_batch,
    post_file,
    queued_ids,
    rq_job,
    settled,
    taken_in,
)
from worker.runtime.kinds.batch_lines import BatchLines

# More lines than the finalizer reads at a time.
LINES = PAGE_LINES + 150
# What a read that starts finalization may take: far less than writing the files would.
ANSWER_S = 1.0
# How long the lock of a finalizer that died is held in the test (its TTL is 60 s).
HELD_S = 4.5


def _answer(custom_id: str, content: str = "") -> LineResult:
    content = content or f"{custom_id} " * 8
    body = {"object": "chat.completion", "choices": [{"message": {"content": content}}]}
    line = BatchOutputLine.answered(custom_id, 200, body)
    return LineResult(part="output", line=line, input_tokens=3, output_tokens=5)


def _answer_every_queued_line(redis: Redis, keys: Keys, content: str = "") -> dict[int, LineResult]:
    """Record an answer to every queued line as its worker would (`content`: each answer's
    text, else a short one naming its line); the answers by line index."""
    lines = BatchLines(redis, keys)
    answers: dict[int, LineResult] = {}
    for job_id in queued_ids(redis, keys, MODEL, "batch"):
        job = GenerationJob.model_validate(rq_job(redis, job_id).args[0])
        assert job.batch_line is not None
        answers[job.batch_line.index] = _answer(job.batch_line.custom_id, content)
        assert lines.record(job, answers[job.batch_line.index])
    return answers


def test_reading_a_due_batch_answers_finalizing_at_once_then_it_completes_with_its_files(
    chunked: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    keys, _ = stand_in
    http = chunked
    lines = [chat_line(f"r{i}", "Hi", max_tokens=1) for i in range(LINES)]
    lines[7]["body"]["stream"] = True  # refused alone: the error file's one line
    data = "\n".join(json.dumps(line) for line in lines).encode()
    file_id = post_file(http, data).get_json()["id"]
    created = http.post(
        "/v1/batches",
        json={"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"},
    ).get_json()
    taken_in(redis, keys, created["id"])
    answers = _answer_every_queued_line(redis, keys)
    assert len(answers) == LINES - 1

    started = time.monotonic()
    due = http.get(f"/v1/batches/{created['id']}").get_json()
    assert time.monotonic() - started < ANSWER_S
    assert due["status"] == "finalizing" and due["finalizing_at"] is not None
    assert due["output_file_id"] is None

    done = settled(http, created["id"])
    assert done["status"] == "completed" and done["completed_at"] is not None
    assert done["request_counts"] == {"total": LINES, "completed": LINES - 1, "failed": 1}
    assert done["usage"]["input_tokens"] == 3 * (LINES - 1)
    assert done["usage"]["output_tokens"] == 5 * (LINES - 1)
    expected = b"".join(answers[i].line.model_dump_json().encode() + b"\n" for i in sorted(answers))
    output = download(http, done["output_file_id"])
    assert output == expected
    kept = chunks_kept(redis, keys, done["output_file_id"])
    assert len(kept) == -(-len(expected) // SMALL_CHUNK) > 1 and b"".join(kept) == expected
    assert http.get(f"/v1/files/{done['output_file_id']}").get_json()["bytes"] == len(expected)
    (error,) = [json.loads(line) for line in download(http, done["error_file_id"]).splitlines()]
    assert error["custom_id"] == "r7" and error["response"]["body"]["error"]["param"] == "stream"
    assert not redis.exists(keys.batch_results(created["id"]), keys.batch_lines(created["id"]))
    assert not redis.exists(keys.batch_finalizing(created["id"]))


def test_a_message_batchs_results_are_streamed_once_it_has_ended(
    chunked: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    keys, _ = stand_in
    http = chunked
    params = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    requests = [{"custom_id": f"m{i}", "params": params} for i in range(60)]
    created = http.post("/v1/messages/batches", json={"requests": requests}).get_json()
    taken_in(redis, keys, created["id"])
    _answer_every_queued_line(redis, keys)
    ended = ended_message_batch(http, created["id"])
    assert ended["request_counts"]["succeeded"] == 60
    with http.get(f"/v1/messages/batches/{created['id']}/results") as reply:
        assert reply.status_code == 200
        pieces = list(reply.response)  # what the route yields: a line at a time
    assert len(pieces) == 60
    results: list[dict[str, Any]] = [json.loads(piece) for piece in pieces]
    assert [r["custom_id"] for r in results] == [f"m{i}" for i in range(60)]
    assert {r["result"]["type"] for r in results} == {"succeeded"}


def _three_answered_lines(
    http: FlaskClient, redis: Redis, keys: Keys, content: str = ""
) -> tuple[str, str]:
    """A batch of three lines, each answered (with `content`) and recorded, not yet read since:
    its input file's id and its own."""
    data = "\n".join(json.dumps(chat_line(f"r{i}", "Hi", max_tokens=1)) for i in range(3))
    file_id = post_file(http, data.encode()).get_json()["id"]
    body = {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"}
    batch_id = http.post("/v1/batches", json=body).get_json()["id"]
    taken_in(redis, keys, batch_id)
    answered = _answer_every_queued_line(redis, keys, content)
    assert len(answered) == 3, redis.hgetall(keys.batch(batch_id))
    return file_id, batch_id


@pytest.mark.parametrize("long_answers", [False, True])
def test_a_small_batch_is_finalized_by_its_read_unless_its_answers_hold_many_bytes(
    http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub], long_answers: bool
) -> None:
    keys, _ = stand_in
    content = "word " * (INLINE_BYTES // 10) if long_answers else ""  # 3 x half of INLINE_BYTES
    _, batch_id = _three_answered_lines(http, redis, keys, content)
    read = http.get(f"/v1/batches/{batch_id}").get_json()
    assert read["status"] == ("finalizing" if long_answers else "completed")
    assert settled(http, batch_id)["request_counts"]["completed"] == 3


def test_a_read_starts_no_finalizer_while_one_holds_the_lock_and_one_once_it_has_expired(
    http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    """A finalizer that died leaves its lock to expire; until then no read starts another."""
    keys, _ = stand_in
    _, batch_id = _three_answered_lines(http, redis, keys)
    redis.set(keys.batch_finalizing(batch_id), 1, px=int(HELD_S * 1000))  # a finalizer that died
    for _ in range(3):
        assert http.get(f"/v1/batches/{batch_id}").get_json()["status"] == "finalizing"
        time.sleep(HELD_S / 3)  # time enough for a finalizer started meanwhile to end
    assert settled(http, batch_id)["status"] == "completed"


def test_a_finalizer_whose_lock_another_holds_now_stops_and_writes_no_file(
    app: Flask, http: FlaskClient, redis: Redis, stand_in: tuple[Keys, PubSub]
) -> None:
    """A finalizer whose lock expired under it (a page outlasted the lock) and was taken by
    another stops at its next page: no second set of files, and the other's lock stays."""
    keys, _ = stand_in
    file_id, batch_id = _three_answered_lines(http, redis, keys)
    lock = keys.batch_finalizing(batch_id)
    redis.set(lock, "the other finalizer's", ex=60)
    assert http.get(f"/v1/batches/{batch_id}").get_json()["status"] == "finalizing"
    stored = StoredBatch.model_validate_json(redis.hget(keys.batch(batch_id), "record"))  # type: ignore[arg-type]
    with app.app_context():
        broker = app.extensions["mlxq.broker"]
        order = FinalizeOrder(broker.settings, ANONYMOUS, stored, lock_token="this one's")
        with pytest.raises(LockLost):
            Finalizer(order, broker).run()
    assert redis.get(lock) == b"the other finalizer's"
    assert http.get(f"/v1/batches/{batch_id}").get_json()["output_file_id"] is None
    assert [f["id"] for f in http.get("/v1/files").get_json()["data"]] == [file_id]
