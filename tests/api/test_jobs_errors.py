"""Responses, files and batches refuse bad input the OpenAI way, in-process on the real Redis.

No worker is needed: everything here is answered before a job would run.
"""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient

from api import create_app
from shared.queue.config import Settings
from tests.support import assert_openai_error, batch_body, post_file

RESPONSES = "/v1/responses"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tools", [{"type": "web_search"}]),
        ("previous_response_id", "resp_x"),
        ("conversation", "conv_1"),
        ("include", ["message.output_text.logprobs"]),
        ("max_tool_calls", 2),
    ],
)
def test_unsupported_responses_features_are_refused_by_name(
    http: FlaskClient, field: str, value: object
) -> None:
    response = http.post(RESPONSES, json={"model": "m", "input": "hi", field: value})
    assert_openai_error(response, 400, field)
    assert response.get_json()["error"]["code"] == "unsupported_parameter"


def test_image_input_is_refused(http: FlaskClient) -> None:
    content = [{"type": "input_image", "image_url": "http://x"}]
    body = {"model": "m", "input": [{"role": "user", "content": content}]}
    assert_openai_error(http.post(RESPONSES, json=body), 400)


def test_unknown_responses_argument_is_named(http: FlaskClient) -> None:
    response = http.post(RESPONSES, json={"model": "m", "input": "hi", "frobnicate": 1})
    assert_openai_error(response, 400, "frobnicate")


def test_background_without_store_is_a_400(http: FlaskClient) -> None:
    body = {"model": "m", "input": "hi", "background": True, "store": False}
    assert_openai_error(http.post(RESPONSES, json=body), 400, "store")


def test_unknown_response_is_a_404_everywhere(http: FlaskClient) -> None:
    assert_openai_error(http.get(f"{RESPONSES}/resp_nope"), 404)
    assert_openai_error(http.get(f"{RESPONSES}/resp_nope?stream=true"), 404)
    assert_openai_error(http.post(f"{RESPONSES}/resp_nope/cancel"), 404)
    assert_openai_error(http.delete(f"{RESPONSES}/resp_nope"), 404)


def test_unknown_file_and_batch_are_404s(http: FlaskClient) -> None:
    assert_openai_error(http.get("/v1/files/file-nope"), 404)
    assert_openai_error(http.get("/v1/files/file-nope/content"), 404)
    assert_openai_error(http.delete("/v1/files/file-nope"), 404)
    assert_openai_error(http.get("/v1/batches/batch_nope"), 404)
    assert_openai_error(http.post("/v1/batches/batch_nope/cancel"), 404)
    assert_openai_error(http.post("/v1/batches", json=batch_body("file-nope")), 404)


def test_upload_over_the_size_cap_is_a_413(app_settings: Settings) -> None:
    small = app_settings.model_copy(update={"max_file_bytes": 2048})
    http = create_app(small).test_client()
    assert post_file(http, b"x" * 2000).status_code == 200
    assert_openai_error(post_file(http, b"x" * 3000), 413)
    assert_openai_error(post_file(http, b"x" * 200_000), 413)


def test_upload_needs_purpose_batch_and_a_file(http: FlaskClient) -> None:
    assert_openai_error(post_file(http, b"{}", purpose="fine-tune"), 400, "purpose")
    response = http.post("/v1/files", data={"purpose": "batch"}, content_type="multipart/form-data")
    assert_openai_error(response, 400, "file")


def test_batch_needs_a_known_endpoint_and_the_24h_window(http: FlaskClient) -> None:
    body = {"input_file_id": "f", "endpoint": "/v1/embeddings", "completion_window": "24h"}
    assert_openai_error(http.post("/v1/batches", json=body), 400, "endpoint")
    body = {"input_file_id": "f", "endpoint": "/v1/completions", "completion_window": "1h"}
    assert_openai_error(http.post("/v1/batches", json=body), 400, "completion_window")


def test_lists_page_with_after_and_limit(http: FlaskClient) -> None:
    ids = [post_file(http, b"{}\n").get_json()["id"] for _ in range(3)]
    first = http.get("/v1/files?limit=2").get_json()
    assert [f["id"] for f in first["data"]] == ids[::-1][:2]
    assert first["has_more"] is True
    rest = http.get(f"/v1/files?limit=2&after={first['last_id']}").get_json()
    assert rest["data"][0]["id"] == ids[0]
    assert_openai_error(http.get("/v1/files?limit=0"), 400, "limit")
    assert_openai_error(http.get("/v1/batches?bogus=1"), 400, "bogus")
