"""Anthropic's Message Batches API (/v1/messages/batches): its request, batch object and result
lines, translated onto the Batch API's machinery (shared/wire/batch/batches.py,
api/stores/batches.py).

A message batch is a batch on the endpoint `/v1/messages`: its requests become the JSONL lines
the Batch API takes in (`lines`, read by the batch's intake process: api/stores/batch_feed.py),
each run as a batch line on the model's batch queue, each answered by a worker with the message
body (`answer_body`). What the batch store keeps in OpenAI's terms is read back here in
Anthropic's: the status (in_progress, validating included; canceling; ended), the request
counts, and each line of the output and error files as a result (`succeeded` with the message,
`errored` with Anthropic's error body, `canceled`, `expired`); a batch that failed whole (over
its key's queued tokens) answers every request `errored` with its error (`failed_result`).
A request naming a model nobody serves ends `errored` alone, as Anthropic's does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.wire.anthropic.message_answers import AnthropicErrorBody, anthropic_error
from shared.wire.anthropic.messages import MESSAGES_PATH
from shared.wire.batch.batches import MAX_LINES, Batch, BatchError, BatchOutputLine
from shared.wire.errors import ErrorBody, ErrorDetail
from shared.wire.ids import ID_PATTERN

# Lines the batch store ends without an answer, by its error code.
_UNANSWERED: dict[str, Literal["canceled", "expired"]] = {
    "batch_cancelled": "canceled",
    "batch_expired": "expired",
}


class MessageBatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    custom_id: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    # A message request's body; checked line by line, as a batch line's body is (a bad one
    # fails alone, `errored`).
    params: dict[str, Any]


class MessageBatchCreate(BaseModel):
    """POST /v1/messages/batches."""

    model_config = ConfigDict(extra="forbid")
    requests: Annotated[list[MessageBatchRequest], Field(min_length=1, max_length=MAX_LINES)]

    @model_validator(mode="after")
    def _custom_ids_once(self) -> MessageBatchCreate:
        """A repeated custom_id refuses the whole batch (no result could be told apart)."""
        seen: set[str] = set()
        for request in self.requests:
            if request.custom_id in seen:
                raise ValueError(f"The custom_id '{request.custom_id}' appears more than once.")
            seen.add(request.custom_id)
        return self

    def lines(self) -> Iterator[dict[str, Any]]:
        """The requests as the Batch API's input lines."""
        for r in self.requests:
            yield {
                "custom_id": r.custom_id,
                "method": "POST",
                "url": MESSAGES_PATH,
                "body": r.params,
            }


class MessageBatchListQuery(BaseModel):
    """The query of GET /v1/messages/batches (newest first)."""

    model_config = ConfigDict(extra="forbid")
    after_id: Annotated[str, Field(pattern=ID_PATTERN)] | None = None
    limit: int = Field(default=20, ge=1, le=1000)


class RequestCounts(BaseModel):
    processing: int = 0
    succeeded: int = 0
    errored: int = 0
    canceled: int = 0
    expired: int = 0


class MessageBatch(BaseModel):
    id: str
    type: Literal["message_batch"] = "message_batch"
    processing_status: Literal["in_progress", "canceling", "ended"]
    request_counts: RequestCounts
    created_at: datetime
    expires_at: datetime
    ended_at: datetime | None = None
    cancel_initiated_at: datetime | None = None
    archived_at: datetime | None = None
    results_url: str | None = None


class MessageBatchList(BaseModel):
    data: list[MessageBatch]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


class DeletedMessageBatch(BaseModel):
    id: str
    type: Literal["message_batch_deleted"] = "message_batch_deleted"


class SucceededResult(BaseModel):
    type: Literal["succeeded"] = "succeeded"
    message: dict[str, Any]  # the message body, as POST /v1/messages answers it


class ErroredResult(BaseModel):
    type: Literal["errored"] = "errored"
    error: AnthropicErrorBody


class CanceledResult(BaseModel):
    type: Literal["canceled"] = "canceled"


class ExpiredResult(BaseModel):
    type: Literal["expired"] = "expired"


Result = Annotated[
    SucceededResult | ErroredResult | CanceledResult | ExpiredResult, Field(discriminator="type")
]


class IndividualResponse(BaseModel):
    """One line of a message batch's results."""

    custom_id: str
    result: Result


def result_of(line: BatchOutputLine) -> IndividualResponse:
    """A line of the batch's output or error file as Anthropic's result."""
    response, error = line.response, line.error
    result: SucceededResult | ErroredResult | CanceledResult | ExpiredResult
    if response is not None and response.status_code == 200:
        result = SucceededResult(message=response.body)
    elif response is not None:
        detail = ErrorBody.model_validate(response.body).error
        result = ErroredResult(error=anthropic_error(response.status_code, detail)[1])
    elif error is not None and error.code in _UNANSWERED:
        result = CanceledResult() if _UNANSWERED[error.code] == "canceled" else ExpiredResult()
    else:
        message = error.message if error is not None else "The request was not answered."
        body = ErrorBody.model_validate({"error": {"message": message, "type": "server_error"}})
        result = ErroredResult(error=anthropic_error(500, body.error)[1])
    return IndividualResponse(custom_id=line.custom_id, result=result)


def failed_result(custom_id: str, error: BatchError) -> IndividualResponse:
    """A request of a message batch that failed whole (over its key's queued tokens, or its
    intake stopped): `errored` with the batch's error."""
    status = 429 if error.code == "token_limit_exceeded" else 500
    detail = ErrorDetail(message=error.message, type="batch_failed", code=error.code)
    return IndividualResponse(
        custom_id=custom_id, result=ErroredResult(error=anthropic_error(status, detail)[1])
    )


def _when(seconds: int | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def message_batch(
    batch: Batch, results: Iterable[IndividualResponse] | None, results_url: str
) -> MessageBatch:
    """The batch in Anthropic's terms; `results` (all of them, counted as they come) once it
    has ended."""
    counts = RequestCounts(
        processing=batch.request_counts.total
        - batch.request_counts.completed
        - batch.request_counts.failed,
        succeeded=batch.request_counts.completed,
        errored=batch.request_counts.failed,
    )
    ended = results is not None
    if results is not None:
        kinds = Counter(r.result.type for r in results)
        counts = RequestCounts(
            succeeded=kinds["succeeded"],
            errored=kinds["errored"],
            canceled=kinds["canceled"],
            expired=kinds["expired"],
        )
    ended_at = batch.completed_at or batch.cancelled_at or batch.expired_at or batch.failed_at
    return MessageBatch(
        id=batch.id,
        processing_status="ended" if ended else _processing(batch),
        request_counts=counts,
        created_at=datetime.fromtimestamp(batch.created_at, UTC),
        expires_at=datetime.fromtimestamp(batch.expires_at or batch.created_at, UTC),
        ended_at=_when(ended_at) if ended else None,
        cancel_initiated_at=_when(batch.cancelling_at),
        results_url=results_url if ended else None,
    )


def _processing(batch: Batch) -> Literal["in_progress", "canceling"]:
    return "canceling" if batch.status == "cancelling" else "in_progress"
