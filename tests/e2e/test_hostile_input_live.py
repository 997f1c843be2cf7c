"""Hostile input against the real stack over real HTTP: every malformed request gets a 4xx with
OpenAI's error body, nothing is logged at ERROR by the API or the worker, and the worker keeps
serving. Unusual but valid text (right-to-left marks, emoji, combining marks) is answered 200."""

from __future__ import annotations

import contextlib
import http.client
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import openai
import pytest

from tests.support import MODEL

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]
JSON_TYPE = {"Content-Type": "application/json"}
THIRTY_MB = 30 * 1024 * 1024


def send(
    api_url: str, method: str, path: str, body: bytes = b"", **headers: str
) -> tuple[int, dict]:
    """One request; a body the server refuses early may be cut short (the server stops reading)."""
    url = urlparse(api_url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=60)
    try:
        conn.putrequest(method, path)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            conn.putheader(name, value)
        conn.endheaders()
        try:
            for i in range(0, len(body), 1 << 20):
                conn.send(body[i : i + (1 << 20)])
        except (BrokenPipeError, ConnectionResetError):
            pass
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def send_chunked(api_url: str, path: str, pieces: Iterator[bytes]) -> tuple[int, dict]:
    url = urlparse(api_url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=60)
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.request("POST", path, body=pieces, headers=JSON_TYPE, encode_chunked=True)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def chat_body(**fields: object) -> bytes:
    return json.dumps({"model": MODEL, "messages": HI, **fields}).encode()


def malformed() -> list[tuple[str, str, bytes, dict[str, str], int]]:
    deep = b"[" * 100_000 + b"]" * 100_000
    deep_messages = b'{"model": "' + MODEL.encode() + b'", "messages": ' + deep + b"}"
    return [
        ("POST", CHAT, b"{not json", JSON_TYPE, 400),
        ("POST", CHAT, b"", JSON_TYPE, 400),
        ("POST", CHAT, b"[1, 2]", JSON_TYPE, 400),
        ("POST", CHAT, b"42", JSON_TYPE, 400),
        ("POST", CHAT, chat_body(stop=[1, 2]), JSON_TYPE, 400),
        ("POST", CHAT, chat_body(messages=[{"role": "wizard", "content": "x"}]), JSON_TYPE, 400),
        ("POST", CHAT, chat_body()[:-1] + b', "temperature": NaN}', JSON_TYPE, 400),
        ("POST", CHAT, chat_body()[:-1] + b', "top_p": Infinity}', JSON_TYPE, 400),
        ("POST", CHAT, chat_body()[:-1] + b', "temperature": 1e999}', JSON_TYPE, 400),
        ("POST", CHAT, deep, JSON_TYPE, 400),
        ("POST", CHAT, deep_messages, JSON_TYPE, 400),
        ("POST", CHAT, chat_body(messages=[{"role": "user", "content": "a\x00b"}]), JSON_TYPE, 400),
        ("POST", CHAT, chat_body()[:-1] + b', "user": "\\ud800"}', JSON_TYPE, 400),
        ("POST", "/v1/completions", b'{"model": "m", "prompt": "\xed\xa0\x80"}', JSON_TYPE, 400),
        ("POST", CHAT, chat_body(), {"Content-Type": "text/plain"}, 415),
        ("POST", CHAT, chat_body(), {}, 415),
        ("POST", CHAT, chat_body(max_tokens=10**40), JSON_TYPE, 400),
        ("POST", CHAT, chat_body(n=1000), JSON_TYPE, 400),
        ("GET", CHAT, b"", {}, 405),
        ("DELETE", "/v1/models", b"", {}, 405),
        ("GET", "/v1/does-not-exist", b"", {}, 404),
        ("POST", CHAT, b"x" * THIRTY_MB, JSON_TYPE, 413),
    ]  # fmt: skip


@pytest.fixture
def log_offsets(logs: Path) -> dict[str, int]:
    return {name: (logs / name).stat().st_size for name in ("api.log", "worker.log")}


def new_log_lines(logs: Path, offsets: dict[str, int]) -> list[str]:
    lines = []
    for name, offset in offsets.items():
        with (logs / name).open("rb") as f:
            f.seek(offset)
            lines += f.read().decode(errors="replace").splitlines()
    return lines


def test_malformed_requests_get_4xx_and_leave_no_trace(
    api_url: str,
    client: openai.OpenAI,
    worker_process: subprocess.Popen[bytes],
    logs: Path,
    log_offsets: dict[str, int],
) -> None:
    for method, path, body, headers, status in malformed():
        got, error = send(api_url, method, path, body, **headers)
        assert got == status, (method, path, body[:80], error)
        assert set(error["error"]) == {"message", "type", "param", "code"}, error
    got, error = send_chunked(api_url, CHAT, (b"x" * (1 << 20) for _ in range(30)))
    assert got == 413, error

    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=20,
    )
    assert "Paris" in (reply.choices[0].message.content or "")
    assert worker_process.poll() is None
    noisy = [
        line for line in new_log_lines(logs, log_offsets) if "ERROR" in line or "Traceback" in line
    ]
    assert noisy == []


@pytest.mark.parametrize(
    "content",
    [
        "\u202eright-to-left override\u202c and \u200fRLM\u200e",
        "مرحبا بالعالم",
        "e\u0301\u0301\u0301 zalgo\u0336 \U0001f600\u200d\U0001f4bb \ufeff",
        "\t\r\n\u2028\u2029 \x7f\x1b[31m",
    ],
)
def test_unusual_but_valid_text_is_answered(client: openai.OpenAI, content: str) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=2
    )
    assert reply.choices[0].finish_reason in ("length", "stop")
