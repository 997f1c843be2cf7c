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

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import EventSource, SSEError, connect_sse

from worker.gguf.default_model import DEFAULT_MODEL_NAME as MODEL

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


def _error(response: httpx.Response) -> Outcome:
    try:
        code = str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return Outcome("unclear", f"HTTP {response.status_code} without an OpenAI error body")
    return Outcome("error", code, float(response.headers.get("retry-after", 0)))


def _guarded(fn: Callable[[], Outcome]) -> Outcome:
    try:
        return fn()
    except httpx.TimeoutException:
        return Outcome("hung", f"nothing for {HANG_S:.0f} s")
    except (httpx.TransportError, SSEError) as err:
        return Outcome("unclear", type(err).__name__)


def _whole(base_url: str, path: str, body: dict[str, Any]) -> Outcome:
    response = httpx.post(f"{base_url}{path}", json=body, timeout=HANG_S)
    if response.status_code != 200:
        return _error(response)
    choices = response.json().get("choices") or [{}]
    ended = choices[0].get("finish_reason") in ("stop", "length")
    return Outcome("completed") if ended else Outcome("unclear", "a body without finish_reason")


def _streamed(base_url: str, path: str, body: dict[str, Any], leave_after: int | None) -> Outcome:
    with (
        httpx.Client(timeout=HANG_S) as client,
        connect_sse(client, "POST", f"{base_url}{path}", json={**body, "stream": True}) as source,
    ):
        if source.response.status_code != 200:
            source.response.read()
            return _error(source.response)
        return _read_stream(source, leave_after)


def _read_stream(source: EventSource, leave_after: int | None) -> Outcome:
    finished = False
    for chunks, event in enumerate(source.iter_sse(), start=1):
        if event.data == "[DONE]":
            return Outcome("completed") if finished else Outcome("unclear", "[DONE] too early")
        frame = json.loads(event.data)
        if "error" in frame:
            return Outcome("error", str(frame["error"].get("code")))
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
