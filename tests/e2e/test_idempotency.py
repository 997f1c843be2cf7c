"""A POST whose answer is lost, retried by the OpenAI SDK with the same Idempotency-Key,
creates one object, on the live stack (real Redis, API under gunicorn, worker, model).

The answer is lost after the server sent it: the client's transport reads it, drops it and
raises a read timeout, and the SDK's own retry loop sends the request again. The SDK sends
`extra_headers` on every try, so the key given there is the key of every retry. (The installed
SDK makes up a `stainless-python-retry-...` key per call but sends it only where the client
names an idempotency header, which `OpenAI` does not.)"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import httpx2
import openai
import pytest

from tests.support import MODEL, chat_line

KEY = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"


class LoseFirstAnswer(httpx2.BaseTransport):
    """Forwards every request; the answer to the first POST is read and then lost."""

    def __init__(self) -> None:
        self._inner = httpx2.HTTPTransport()
        self.lost: list[dict[str, Any]] = []

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = self._inner.handle_request(request)
        if request.method == "POST" and not self.lost:
            self.lost.append(json.loads(response.read()))
            response.close()
            raise httpx2.ReadTimeout("the answer was lost on the way", request=request)
        return response

    def close(self) -> None:
        self._inner.close()


@pytest.fixture
def lossy(api_url: str, worker_process: object) -> Iterator[tuple[openai.OpenAI, LoseFirstAnswer]]:
    transport = LoseFirstAnswer()
    http = httpx2.Client(transport=transport)
    client = openai.OpenAI(
        base_url=f"{api_url}/v1", api_key="unused", max_retries=2, http_client=http
    )
    yield client, transport
    http.close()  # and its transport's connections: a client given to the SDK is the caller's


def _key() -> dict[str, str]:
    return {KEY: f"test-{uuid.uuid4()}"}


def _file_ids(client: openai.OpenAI, filename: str) -> list[str]:
    return [f.id for f in client.files.list(limit=10_000) if f.filename == filename]


def test_a_lost_upload_retried_with_its_key_creates_one_file(
    lossy: tuple[openai.OpenAI, LoseFirstAnswer], client: openai.OpenAI
) -> None:
    sdk, transport = lossy
    name = f"{uuid.uuid4()}.jsonl"
    line = json.dumps(chat_line("a", "hi")).encode()
    created = sdk.files.create(file=(name, line), purpose="batch", extra_headers=_key())
    assert transport.lost[0]["id"] == created.id
    assert _file_ids(client, name) == [created.id]


def test_without_a_key_the_same_loss_creates_two_files(
    lossy: tuple[openai.OpenAI, LoseFirstAnswer], client: openai.OpenAI
) -> None:
    """The control: what the key prevents."""
    sdk, transport = lossy
    name = f"{uuid.uuid4()}.jsonl"
    created = sdk.files.create(file=(name, b"{}\n"), purpose="batch")
    assert transport.lost[0]["id"] != created.id
    assert sorted(_file_ids(client, name)) == sorted([created.id, transport.lost[0]["id"]])


def test_a_lost_batch_create_retried_with_its_key_creates_one_batch(
    lossy: tuple[openai.OpenAI, LoseFirstAnswer], client: openai.OpenAI
) -> None:
    sdk, transport = lossy
    lines = [chat_line(f"l{i}", "Say hi", max_tokens=2) for i in range(2)]
    data = "\n".join(map(json.dumps, lines)).encode()
    file_id = client.files.create(file=("in.jsonl", data), purpose="batch").id
    batch = sdk.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_headers=_key(),
    )
    assert transport.lost[0]["id"] == batch.id
    ids = [b.id for b in client.batches.list(limit=100) if b.input_file_id == file_id]
    assert ids == [batch.id]


def test_a_lost_background_response_retried_with_its_key_runs_once(
    lossy: tuple[openai.OpenAI, LoseFirstAnswer], client: openai.OpenAI
) -> None:
    sdk, transport = lossy
    response = sdk.responses.create(
        model=MODEL, input="Say hi", max_output_tokens=4, background=True, extra_headers=_key()
    )
    assert transport.lost[0]["id"] == response.id


def test_two_tries_at_once_with_one_key_create_one_batch(
    api_url: str, client: openai.OpenAI
) -> None:
    """Of four tries sent together, one creates the batch; each other is either told the key is
    in use (409, Retry-After) or, once the first has answered, given that answer again."""
    file_id = client.files.create(file=("in.jsonl", b"not json\n"), purpose="batch").id
    body = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}
    headers = _key()
    start = threading.Barrier(4)

    def attempt() -> httpx.Response:
        start.wait(timeout=30)
        return httpx.post(f"{api_url}/v1/batches", json=body, headers=headers, timeout=30)

    with ThreadPoolExecutor(4) as pool:
        tries = [pool.submit(attempt) for _ in range(4)]
        answers = [t.result(timeout=60) for t in tries]  # a try's exception is raised here

    assert len(answers) == 4
    assert {a.status_code for a in answers} <= {200, 409}, [a.text for a in answers]
    created = [a for a in answers if a.status_code == 200]
    first = [a for a in created if REPLAYED not in a.headers]
    assert len(first) == 1, [dict(a.headers) for a in created]
    batch = first[0].json()
    assert batch["object"] == "batch" and batch["input_file_id"] == file_id
    for again in created:
        assert again.content == first[0].content  # a replay is the first answer, byte for byte
    for replay in (a for a in created if a is not first[0]):
        assert replay.headers[REPLAYED] == "true"
    for busy in (a for a in answers if a.status_code == 409):
        assert busy.json()["error"]["code"] == "idempotency_key_in_use"
        assert busy.json()["error"]["param"] == KEY
        assert busy.headers["Retry-After"] == "1"
    ids = [b.id for b in client.batches.list(limit=100) if b.input_file_id == file_id]
    assert ids == [batch["id"]]


def test_a_message_retried_with_its_key_is_answered_once_and_a_changed_body_is_refused(
    api_url: str, worker_process: object
) -> None:
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    headers = {**_key(), "anthropic-version": "2023-06-01"}
    url = f"{api_url}/v1/messages"
    first = httpx.post(url, json=body, headers=headers, timeout=60)
    again = httpx.post(url, json=body, headers=headers, timeout=60)
    assert first.status_code == again.status_code == 200, first.text
    assert again.json()["id"] == first.json()["id"]
    changed = httpx.post(url, json={**body, "max_tokens": 9}, headers=headers, timeout=60)
    assert changed.status_code == 422
    assert changed.json()["type"] == "error"
    assert changed.json()["error"]["type"] == "invalid_request_error"
    assert KEY in changed.json()["error"]["message"]
