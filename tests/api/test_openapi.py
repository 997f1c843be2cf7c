"""/openapi.json documents every route, and generated requests (schemathesis) never get a 5xx
and always get a response that matches the document.

The fuzzed app is the real Flask app on the real Redis, with API keys configured, under a
namespace no worker serves: every request is answered before a job would be queued (a valid
generation request gets 404 `model_not_found`), so nothing generates and the worker is never
touched. tests/e2e/test_openapi_live.py fuzzes the real stack, where requests do generate.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    ignored_auth,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from api import create_app
from api.routes.openapi import document
from shared.queue.config import Settings

KEY = "sk-fuzz-0123456789abcdef"
# Per operation, besides schemathesis's coverage phase (its boundary values of every field);
# derandomized, so every run sends the same ones. tests/api/test_key_isolation_fuzz.py and
# tests/e2e/test_openapi_live.py fuzz every route again, as two keys and on the live stack.
EXAMPLES = 25
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    response_schema_conformance,
    negative_data_rejection,
    ignored_auth,
    unsupported_method,
]


@pytest.fixture(scope="module")
def fuzzed_app(settings: Settings) -> Flask:
    fuzz = settings.model_copy(
        update={"namespace": "mlxqfuzz", "api_keys": Settings(api_keys=KEY).api_keys}
    )
    return create_app(fuzz)


# The very document the app serves (test_the_served_document_is_this_one checks it).
schema = schemathesis.openapi.from_dict(document())
# Its "extra parameter" mutation of a query (the list routes' after/limit) can come out as the
# documented parameters alone, then flagged as accepted negative data; unknown parameters are a
# 400 naming them (tests/api/test_jobs_errors.py checks it).
schema.config.generation.update(allow_extra_parameters=False)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same examples every run: CI must not depend on a lucky draw
    suppress_health_check=list(HealthCheck),
)
def test_generated_requests_get_documented_answers_and_no_5xx(case: Any, fuzzed_app: Flask) -> None:
    case.operation.app = case.operation.schema.app = fuzzed_app  # follow-up requests too
    # `buffered`, passed on to werkzeug's client: the answer is read and closed at once, so a file
    # the page sends (which schemathesis reads and never closes) is not left open.
    auth = {"Authorization": f"Bearer {KEY}"}
    case.call_and_validate(headers=auth, checks=CHECKS, buffered=True)


def test_the_served_document_is_this_one(fuzzed_app: Flask) -> None:
    assert fuzzed_app.test_client().get("/openapi.json").get_json() == document()


def test_every_route_and_method_is_documented(fuzzed_app: Flask) -> None:
    document = fuzzed_app.test_client().get("/openapi.json").get_json()
    documented = {
        (method.upper(), path) for path, item in document["paths"].items() for method in item
    }
    served = {
        (method, rule.rule.replace("<path:", "{").replace("<", "{").replace(">", "}"))
        for rule in fuzzed_app.url_map.iter_rules()
        if rule.endpoint != "static"
        for method in rule.methods or ()
        if method not in ("HEAD", "OPTIONS")
    }
    assert served == documented


def test_the_document_is_public_and_generated_from_the_models(fuzzed_app: Flask) -> None:
    http: FlaskClient = fuzzed_app.test_client()
    document = http.get("/openapi.json").get_json()
    assert document["openapi"].startswith("3.1")
    request = document["components"]["schemas"]["ChatCompletionRequest"]
    assert request["additionalProperties"] is False
    assert request["properties"]["messages"]["maxItems"] == 2048
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert document["paths"]["/health"]["get"]["security"] == []


def test_the_429s_state_the_rate_limit_headers_and_so_do_those_routes_answers() -> None:
    paths: Any = document()["paths"]
    chat = paths["/v1/chat/completions"]["post"]["responses"]
    assert {"Retry-After", "retry-after-ms", "x-should-retry"} <= set(chat["429"]["headers"])
    assert "rate_limit_exceeded" in chat["429"]["description"]
    assert "x-ratelimit-remaining-tokens" in chat["200"]["headers"]
    assert "Retry-After" in paths["/v1/messages"]["post"]["responses"]["429"]["headers"]
    assert "headers" not in paths["/v1/files"]["get"]["responses"]["200"]  # no 429 stated there
