"""The attacks of `bench health` (issue 42). Each is a function that prepares one key's hostile
traffic against the API (bodies encoded, files uploaded) and returns a `Run`: that traffic, for
at most a given time, returning the statuses its requests got.

Preparing happens before the clock starts, and no answer is parsed beyond its status, so the
client threads hold this process's GIL as little as they can: the `/health` poller shares it. A
request still open at the time bound is cut (its status reads "cut"); the API takes a closed
connection as a cancel.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from bench.long_scoring import long_prompt

CUT = "cut"  # a request the time bound closed before it was answered
Statuses = Counter[str]
Run = Callable[[float], Statuses]  # the attack itself, given its time bound in seconds


@dataclass(frozen=True)
class Target:
    """The API under attack: its URL, the attacking key, the model it asks for."""

    url: str
    key: str
    model: str

    def headers(self, body: bool = True) -> dict[str, str]:
        """The attacking key's headers, and a JSON body's content type."""
        auth = {"Authorization": f"Bearer {self.key}"}
        return {**auth, "Content-Type": "application/json"} if body else auth

    def client(self, timeout_s: float) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=max(timeout_s, 0.1))


@dataclass(frozen=True)
class Attack:
    """One attack: its name in the table, what it does, and the function that prepares it."""

    name: str
    what: str
    prepare: Callable[[Target], Run]


def _encoded(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def _post(http: httpx.Client, target: Target, path: str, body: bytes, deadline: float) -> str:
    """One POST as the attacking key, cut at `deadline`; its status."""
    timeout_s = max(deadline - time.monotonic(), 0.1)
    try:
        reply = http.post(path, content=body, headers=target.headers(), timeout=timeout_s)
    except httpx.TimeoutException:
        return CUT
    except httpx.HTTPError as err:  # the connection closed under it, say
        return type(err).__name__
    return str(reply.status_code)


def _read(
    http: httpx.Client,
    method: str,
    url: str,
    headers: dict[str, str],
    deadline: float,
    body: bytes | None = None,
) -> str:
    """One request whose answer is read as it comes (a stream, a download), cut at `deadline`;
    its status."""
    try:
        with http.stream(method, url, content=body, headers=headers) as reply:
            for _ in reply.iter_raw(1 << 16):
                if time.monotonic() >= deadline:
                    return CUT
            return str(reply.status_code)
    except httpx.TimeoutException:
        return CUT
    except httpx.HTTPError as err:  # the connection closed under it, say
        return type(err).__name__


def flood(clients: int, budget_s: float, one: Callable[[httpx.Client, float], str]) -> Statuses:
    """`clients` threads, each calling `one(http, deadline)` again and again until the budget is
    spent; the statuses of every call."""
    deadline = time.monotonic() + budget_s
    statuses: Statuses = Counter()
    lock = threading.Lock()

    def calls() -> None:
        with httpx.Client(timeout=budget_s) as http:
            while time.monotonic() < deadline:
                status = one(http, deadline)
                with lock:
                    statuses[status] += 1

    threads = [threading.Thread(target=calls, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:  # one shared bound: a stream that never answers is left behind
        thread.join(max(deadline + 30 - time.monotonic(), 0))
    return statuses


def posting(target: Target, path: str, body: dict[str, Any], clients: int = 1) -> Run:
    """`clients` at once POSTing `body` to `path` as the attacking key, each again as soon as it
    is answered."""
    encoded = _encoded(body)

    def one(http: httpx.Client, deadline: float) -> str:
        return _post(http, target, f"{target.url}{path}", encoded, deadline)

    return lambda budget_s: flood(clients, budget_s, one)


def idle(target: Target) -> Run:
    """No traffic but the poller's: the machine's own share of /health's latency."""

    def run(budget_s: float) -> Statuses:
        time.sleep(budget_s)
        return Counter()

    return run


def echo_scoring(target: Target, prompts: int = 16, tokens: int = 3600) -> Run:
    """One `/v1/completions` request scoring `prompts` prompts of about `tokens` tokens each
    (`echo: true, logprobs: 1, max_tokens: 1`), the issue's measured request."""
    body = {
        "model": target.model,
        "prompt": [long_prompt(k, tokens) for k in range(prompts)],
        "echo": True,
        "logprobs": 1,
        "max_tokens": 1,
        "temperature": 0,
    }
    return posting(target, "/v1/completions", body)


def batch_lines(model: str, lines: int) -> bytes:
    """A batch input of `lines` one-token chat lines."""
    rows = (
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": f"Say hi ({i})."}],
                "max_tokens": 1,
            },
        }
        for i in range(lines)
    )
    return "\n".join(json.dumps(row) for row in rows).encode()


def upload(target: Target, content: bytes, timeout_s: float) -> str:
    """A file uploaded as the attacking key for the batch purpose; its id."""
    files = {"file": ("in.jsonl", content, "application/jsonl")}
    with target.client(timeout_s) as http:
        reply = http.post(
            "/v1/files", files=files, data={"purpose": "batch"}, headers=target.headers(False)
        )
    reply.raise_for_status()
    return str(reply.json()["id"])


def big_batch(target: Target, lines: int = 50_000) -> Run:
    """A `lines`-line batch uploaded, created and watched until every line is in (or the time
    bound), then cancelled."""
    content = batch_lines(target.model, lines)

    def run(budget_s: float) -> Statuses:
        deadline = time.monotonic() + budget_s
        file_id = upload(target, content, budget_s)
        statuses: Statuses = Counter({"upload 200": 1})
        body = {
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        with target.client(budget_s) as http:
            created = http.post("/v1/batches", content=_encoded(body), headers=target.headers())
            statuses[f"create {created.status_code}"] += 1
            if not created.is_success:
                return statuses
            batch, path = created.json(), f"/v1/batches/{created.json()['id']}"
            while time.monotonic() < deadline:
                if batch["request_counts"]["total"] >= lines or batch["status"] == "failed":
                    statuses[f"{batch['request_counts']['total']} lines in"] += 1
                    break
                time.sleep(0.5)
                batch = http.get(path, headers=target.headers(False)).json()
            http.post(f"{path}/cancel", headers=target.headers(False))
        return statuses

    return run


def count_tokens_flood(target: Target, clients: int = 32, chars: int = 400_000) -> Run:
    """`clients` at once sending `/v1/messages/count_tokens` with a prompt of `chars`
    characters (about a quarter as many tokens), each again as soon as it is answered."""
    words = " ".join(f"word{i % 997}" for i in range(chars // 8))
    body = {"model": target.model, "messages": [{"role": "user", "content": words[:chars]}]}
    return posting(target, "/v1/messages/count_tokens", body, clients)


def big_schema(properties: int = 2_000, description_chars: int = 2_000) -> dict[str, Any]:
    """A JSON schema of `properties` string properties with long descriptions (4 MiB or so)."""
    text = "a field of the record, described at length. " * (description_chars // 45)
    props = {f"field_{i}": {"type": "string", "description": text} for i in range(properties)}
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }


def stored_schema(target: Target, clients: int = 2) -> Run:
    """Stored background responses, each carrying a multi-MiB JSON schema (`text.format`)."""
    body = {
        "model": target.model,
        "input": "Fill in the record.",
        "max_output_tokens": 8,
        "store": True,
        "background": True,
        "text": {
            "format": {"type": "json_schema", "name": "record", "schema": big_schema()},
        },
    }
    return posting(target, "/v1/responses", body, clients)


def many_choices(target: Target, n: int = 128) -> Run:
    """Chat completions of `n` choices, one after another."""
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": "Name a colour."}],
        "n": n,
        "max_tokens": 16,
    }
    return posting(target, "/v1/chat/completions", body)


def open_streams(target: Target, streams: int = 64) -> Run:
    """`streams` SSE chat streams open at once, each read to its end and opened again."""
    body = _encoded(
        {
            "model": target.model,
            "messages": [{"role": "user", "content": "Write a long story about the sea."}],
            "max_tokens": 512,
            "stream": True,
        }
    )
    url, headers = f"{target.url}/v1/chat/completions", target.headers()

    def one(http: httpx.Client, deadline: float) -> str:
        return _read(http, "POST", url, headers, deadline, body)

    return lambda budget_s: flood(streams, budget_s, one)


def file_download(target: Target, clients: int = 4, mib: int = 64) -> Run:
    """`clients` at once downloading a file of `mib` MiB of batch lines (uploaded before the
    clock starts), each again as soon as it has the whole file."""
    line = json.dumps({"custom_id": "x" * 40, "method": "POST", "url": "/v1/chat/completions"})
    content = "\n".join([line] * (mib * 2**20 // (len(line) + 1))).encode()
    url = f"{target.url}/v1/files/{upload(target, content, 600)}/content"
    headers = target.headers(False)

    def one(http: httpx.Client, deadline: float) -> str:
        return _read(http, "GET", url, headers, deadline)

    return lambda budget_s: flood(clients, budget_s, one)


ATTACKS = (
    Attack("idle (baseline)", "no traffic but the poller's", idle),
    Attack("echo/logprobs scoring", "16 prompts of ~3,600 tokens, echo+logprobs", echo_scoring),
    Attack("batch upload + create", "a 50,000-line batch uploaded and created", big_batch),
    Attack("count_tokens flood", "32 clients, 400,000-character prompts", count_tokens_flood),
    Attack("stored response, big schema", "2 clients, ~4 MiB JSON schema each", stored_schema),
    Attack("n=128 chat", "chat completions of 128 choices, one after another", many_choices),
    Attack("64 open streams", "64 SSE chat streams at once", open_streams),
    Attack("big file download", "4 clients downloading a 64 MiB file", file_download),
)
