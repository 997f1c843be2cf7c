"""Stored responses, files and batches belong to their owner: to anyone else they do not exist."""

from __future__ import annotations

import pytest
from flask import Flask
from flask.testing import FlaskClient

from api.queue.broker import Broker
from api.routes import responses
from api.routes.batch import batches, files
from api.stores.responses import ResponseStore
from shared.wire.responses.responses import ResponsesRequest, StoredResponse
from tests.support import assert_openai_error, batch_body, post_file


def act_as(monkeypatch: pytest.MonkeyPatch, owner: str) -> None:
    for module in (files, batches, responses):
        monkeypatch.setattr(module, "owner_id", lambda: owner)


def test_another_owners_file_is_a_404_and_not_listed(
    http: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    act_as(monkeypatch, "alice")
    file_id = post_file(http, b"{}\n").get_json()["id"]
    assert http.get(f"/v1/files/{file_id}").status_code == 200
    act_as(monkeypatch, "bob")
    assert_openai_error(http.get(f"/v1/files/{file_id}"), 404)
    assert_openai_error(http.get(f"/v1/files/{file_id}/content"), 404)
    assert_openai_error(http.delete(f"/v1/files/{file_id}"), 404)
    assert file_id not in [f["id"] for f in http.get("/v1/files").get_json()["data"]]
    assert_openai_error(http.post("/v1/batches", json=batch_body(file_id)), 404)


def test_another_owners_batch_is_a_404_and_not_listed(
    http: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    act_as(monkeypatch, "alice")
    file_id = post_file(http, b"not json\n").get_json()["id"]
    batch = http.post("/v1/batches", json=batch_body(file_id)).get_json()
    assert batch["status"] == "validating"
    act_as(monkeypatch, "bob")
    assert_openai_error(http.get(f"/v1/batches/{batch['id']}"), 404)
    assert_openai_error(http.post(f"/v1/batches/{batch['id']}/cancel"), 404)
    assert batch["id"] not in [b["id"] for b in http.get("/v1/batches").get_json()["data"]]


def test_another_owners_response_is_a_404(
    app: Flask, http: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    with app.app_context():
        store = ResponseStore(app.extensions["mlxq.broker"])
        assert isinstance(app.extensions["mlxq.broker"], Broker)
        request = ResponsesRequest(model="m", input="hi", background=True)
        stored = StoredResponse(id="resp_owned", created_at=1, background=True, request=request)
        store.create("alice", stored.id, store.record(stored))
    act_as(monkeypatch, "alice")
    assert http.get("/v1/responses/resp_owned").get_json()["id"] == "resp_owned"
    act_as(monkeypatch, "bob")
    assert_openai_error(http.get("/v1/responses/resp_owned"), 404)
    assert_openai_error(http.post("/v1/responses/resp_owned/cancel"), 404)
    assert_openai_error(http.delete("/v1/responses/resp_owned"), 404)
