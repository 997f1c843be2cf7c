"""A stored response read just as its job ends (api/stores/responses.py `derive`): the store
reads the events, then RQ's record of the job; a job that ends between the two reads has its
final event logged already, so it reads as completed, never as a lost job's failure."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flask import Flask

from api.stores.responses import ResponseStore
from shared.wire.chat.completions import Usage
from shared.wire.events import DoneEvent, Event, StartedEvent
from shared.wire.responses.response_state import JobView
from shared.wire.responses.responses import ResponsesRequest, StoredResponse

DONE = DoneEvent(
    finish_reason="stop", usage=Usage(prompt_tokens=3, completion_tokens=1, total_tokens=4)
)


def _store(
    app: Flask, monkeypatch: pytest.MonkeyPatch, reads: Iterator[list[Event]]
) -> ResponseStore:
    store = ResponseStore(app.extensions["mlxq.broker"])
    monkeypatch.setattr(store, "events", lambda response_id, start=0: next(reads))
    monkeypatch.setattr(store, "job_view", lambda stored: JobView("ended", outcome="stop"))
    return store


def _stored() -> StoredResponse:
    request = ResponsesRequest(model="m", input="hi", background=True)
    return StoredResponse(id="resp_race", created_at=1, background=True, request=request)


def test_a_job_that_ends_between_the_two_reads_is_completed(
    app: Flask, monkeypatch: pytest.MonkeyPatch
) -> None:
    with app.app_context():
        started = StartedEvent(prompt_tokens=3)
        store = _store(app, monkeypatch, iter([[started], [started, DONE]]))
        assert store.derive(_stored(), cancelled=False).status == "completed"


def test_a_job_that_ended_without_a_final_event_is_failed(
    app: Flask, monkeypatch: pytest.MonkeyPatch
) -> None:
    with app.app_context():
        started = StartedEvent(prompt_tokens=3)
        store = _store(app, monkeypatch, iter([[started], [started]]))
        assert store.derive(_stored(), cancelled=False).status == "failed"
