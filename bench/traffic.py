"""The soak's clients: one function per kind of request, each returning how it ended.

Every request ends one of four ways, and the soak counts them: `completed` (a full body, or a
stream that closed its final chunk with `data: [DONE]`), `error` (an OpenAI error object: an
HTTP error body, or a `data:` error frame in a stream; the code is kept), `left` (the client
hung up on purpose, mid-stream) and `hung` (nothing arrived for HANG_S). Anything else (a
reset connection, a stream that just stops) is `unclear`. `hung` and `unclear` must stay 0.

Adding a kind of traffic (background responses, a batch over HTTP, once the API has them) is a
function with the signature of `chat` added to KINDS.
"""

from __future__ import annotations

import http.client
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from bench.cluster import MODEL

HANG_S = 90.0
PROMPTS = [
    "Write a short poem about the sea.",
    "List three colours.",
    "What is the capital of France?",
    "Tell me a story about a fox.",
    "Count from 1 to 10.",
]


@dataclass(frozen=True)
class Outcome:
    kind: str  # completed | error | left | hung | unclear
    detail: str = ""  # the error code, or what was unclear
    retry_after_s: float = 0.0


def _connect(base_url: str) -> http.client.HTTPConnection:
    url = urlparse(base_url)
    return http.client.HTTPConnection(url.hostname or "", url.port, timeout=HANG_S)


def _post(base_url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    conn = _connect(base_url)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        headers = {k.lower(): v for k, v in response.getheaders()}
        return response.status, headers, response.read()
    finally:
        conn.close()


def _error(status: int, headers: dict[str, str], data: bytes) -> Outcome:
    try:
        code = str(json.loads(data)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return Outcome("unclear", f"HTTP {status} without an OpenAI error body")
    return Outcome("error", code, float(headers.get("retry-after", 0)))


def _guarded(fn: Callable[[], Outcome]) -> Outcome:
    try:
        return fn()
    except TimeoutError:
        return Outcome("hung", f"nothing for {HANG_S:.0f} s")
    except (OSError, http.client.HTTPException) as err:
        return Outcome("unclear", type(err).__name__)


def _whole(base_url: str, path: str, body: dict[str, Any]) -> Outcome:
    status, headers, data = _post(base_url, path, body)
    if status != 200:
        return _error(status, headers, data)
    choices = json.loads(data).get("choices") or [{}]
    ended = choices[0].get("finish_reason") in ("stop", "length")
    return Outcome("completed") if ended else Outcome("unclear", "a body without finish_reason")


def _streamed(base_url: str, path: str, body: dict[str, Any], leave_after: int | None) -> Outcome:
    conn = _connect(base_url)
    try:
        conn.request("POST", path, json.dumps({**body, "stream": True}))
        response = conn.getresponse()
        if response.status != 200:
            headers = {k.lower(): v for k, v in response.getheaders()}
            return _error(response.status, headers, response.read())
        return _read_stream(response, leave_after)
    finally:
        conn.close()


def _read_stream(response: http.client.HTTPResponse, leave_after: int | None) -> Outcome:
    finished, chunks = False, 0
    while line := response.readline():
        text = line.decode().strip()
        if not text.startswith("data: "):
            continue
        payload = text[6:]
        if payload == "[DONE]":
            return Outcome("completed") if finished else Outcome("unclear", "[DONE] too early")
        frame = json.loads(payload)
        if "error" in frame:
            return Outcome("error", str(frame["error"].get("code")))
        chunks += 1
        if leave_after is not None and chunks >= leave_after:
            return Outcome("left")
        choices = frame.get("choices") or [{}]
        finished = finished or choices[0].get("finish_reason") is not None
    return Outcome("unclear", "the stream stopped without [DONE] or an error")


def _chat_body(rng: random.Random) -> dict[str, Any]:
    prompt = rng.choice(PROMPTS)
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": rng.randint(8, 32),
    }


def chat(base_url: str, rng: random.Random) -> Outcome:
    return _guarded(lambda: _whole(base_url, "/v1/chat/completions", _chat_body(rng)))


def chat_stream(base_url: str, rng: random.Random) -> Outcome:
    return _guarded(lambda: _streamed(base_url, "/v1/chat/completions", _chat_body(rng), None))


def completion(base_url: str, rng: random.Random) -> Outcome:
    body = {"model": MODEL, "prompt": rng.choice(PROMPTS), "max_tokens": rng.randint(8, 32)}
    stream = rng.random() < 0.5
    if stream:
        return _guarded(lambda: _streamed(base_url, "/v1/completions", body, None))
    return _guarded(lambda: _whole(base_url, "/v1/completions", body))


def disconnect(base_url: str, rng: random.Random) -> Outcome:
    """A streaming client that hangs up after a few chunks."""
    body = {**_chat_body(rng), "max_tokens": 64}
    leave_after = rng.randint(1, 4)
    return _guarded(lambda: _streamed(base_url, "/v1/chat/completions", body, leave_after))


# Kind of request -> (weight, client).
KINDS: dict[str, tuple[float, Callable[[str, random.Random], Outcome]]] = {
    "chat_stream": (0.4, chat_stream),
    "chat": (0.25, chat),
    "completion": (0.2, completion),
    "disconnect": (0.15, disconnect),
}


def pick(rng: random.Random) -> str:
    names = list(KINDS)
    return rng.choices(names, weights=[KINDS[n][0] for n in names])[0]
