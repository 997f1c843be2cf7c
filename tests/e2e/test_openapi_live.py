"""Schemathesis against the real stack (gunicorn, Redis, the worker on the real model): generated
valid requests that do generate get no 5xx and a response that matches /openapi.json.

To keep the worker's time bounded (prefill on two CPU cores is slow), each generated generation
request is pinned to the served model, to at most `MAX_TOKENS` tokens and 2 choices, and to a
short prompt (the first few messages, each text cut to `MAX_CHARS`); parameters whose validity
spans fields are dropped; everything else in it is as generated. The requests are the
document's examples and schemathesis's coverage phase (each field's boundary values, the odd
valid requests a worker must survive); its random fuzzing phase, which took most of this module's
time for a tenth of its generations, runs in-process in tests/api/test_openapi.py, with the broad
fuzzing (hundreds of requests per route, invalid ones included).
"""

from __future__ import annotations

import collections
from typing import Any

import openai
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.routes.openapi import document
from tests.support import MODEL

MAX_TOKENS = 3
MAX_MESSAGES = 3
MAX_CHARS = 120
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
statuses: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)

schema = schemathesis.openapi.from_dict(document()).exclude(path="/openapi.json")
schema.config.generation.update(modes=[GenerationMode.POSITIVE])
schema.config.phases.update(phases=["examples", "coverage"])  # the same requests every run


def shorten(message: Any) -> Any:
    if isinstance(message, dict) and isinstance(message.get("content"), str):
        return {**message, "content": message["content"][:MAX_CHARS]}
    if isinstance(message, dict) and isinstance(message.get("content"), list):
        parts = message["content"][:MAX_MESSAGES]
        short = [{**p, "text": p["text"][:MAX_CHARS]} if "text" in p else p for p in parts]
        return {**message, "content": short}
    return message


# Parameters whose rules span fields (tool_choice needs tools, top_logprobs needs logprobs, a
# schema must compile): a schema cannot say so, and generated values would all be refused.
ACROSS_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "response_format", "top_logprobs")


def plain_message(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    message = {k: v for k, v in message.items() if k not in ("tool_calls", "tool_call_id")}
    if message.get("role") == "tool":
        message["role"] = "user"
    if message.get("content") is None:
        message["content"] = "hi"
    return shorten(message)


# The field each route bounds its output with (embeddings have none).
OUTPUT_LIMIT = {
    "/v1/chat/completions": "max_tokens",
    "/v1/completions": "max_tokens",
    "/v1/messages": "max_tokens",
    "/v1/responses": "max_output_tokens",
}


def pin(body: dict[str, Any], path: str) -> None:
    body["model"] = MODEL
    for field in ACROSS_FIELDS:
        body.pop(field, None)
    body.pop("logit_bias", None)  # token ids must exist in the model's vocabulary
    if isinstance(body.get("n"), int):
        body["n"] = min(body["n"], 2)
    if isinstance(body.get("messages"), list):
        body["messages"] = [plain_message(m) for m in body["messages"][:MAX_MESSAGES]]
    for field in ("prompt", "input"):
        if isinstance(body.get(field), str):
            body[field] = body[field][:MAX_CHARS]
    limit = OUTPUT_LIMIT.get(path)
    if limit is not None:
        body[limit] = min(body.get(limit) or MAX_TOKENS, MAX_TOKENS)
    if body.get("max_completion_tokens") is not None:
        body["max_completion_tokens"] = min(body["max_completion_tokens"], MAX_TOKENS)


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_generated_requests_to_the_live_stack(
    case: Any, api_url: str, client: openai.OpenAI
) -> None:
    if isinstance(case.body, dict):
        pin(case.body, case.path)
    response = case.call(base_url=api_url, timeout=60)
    statuses[case.path][response.status_code] += 1
    case.validate_response(response, checks=CHECKS)


def test_some_generated_requests_did_generate() -> None:
    print("live statuses:", {path: dict(counts) for path, counts in statuses.items()})
    for path in OUTPUT_LIMIT:  # embeddings: the stack serves no embedding model
        assert statuses[path][200] > 0, dict(statuses)
