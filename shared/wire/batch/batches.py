"""Wire formats of the Batch API: the request, the batch object, input and output lines.

A batch is a hash in Redis (keys.py `batch`), written by the API (creation, cancellation,
finalization) and by the workers (one recorded line each, worker/runtime/kinds/batch_lines.py). Its
fields:

    owner, record     who owns it; `StoredBatch` as JSON (what never changes)
    status, ending    the OpenAI status; the final status finalization will set
    <status>_at       in_progress_at, finalizing_at, completed_at, failed_at, expired_at,
                      cancelling_at, cancelled_at (unix seconds)
    total, completed, failed, input_tokens, output_tokens    counters (`COUNTERS`)
    output_file_id, error_file_id, errors                   set when it ends

Each line's answer is recorded once, as a `LineResult`, in the batch's results hash under the
line's index (first write wins, so a retried line never appears twice). `answer_body` builds the
body a line's endpoint would have answered; worker and API share it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.wire.anthropic.message_answers import message
from shared.wire.anthropic.messages import MessagesRequest
from shared.wire.batch.files import ExpiresAfter
from shared.wire.chat.answers import Transcripts, chat_completion, text_completion
from shared.wire.chat.completions import ChatCompletionRequest, CompletionRequest
from shared.wire.errors import ErrorBody
from shared.wire.events import DoneEvent
from shared.wire.ids import ID_PATTERN, new_id
from shared.wire.responses.response_state import Progress, render
from shared.wire.responses.responses import (
    Metadata,
    ResponsesRequest,
    ResponseUsage,
    StoredResponse,
)

OpenAIEndpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/responses"]
# A batch of Anthropic's Message Batches API (shared/wire/anthropic/message_batches.py) runs its
# requests as the lines of a batch on this endpoint.
Endpoint = OpenAIEndpoint | Literal["/v1/messages"]
LineRequest = ChatCompletionRequest | CompletionRequest | ResponsesRequest | MessagesRequest
REQUEST_MODELS: dict[str, type[LineRequest]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/responses": ResponsesRequest,
    "/v1/messages": MessagesRequest,
}
BatchStatus = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
# The statuses after which a batch no longer changes.
FINAL_STATUSES: frozenset[BatchStatus] = frozenset({"completed", "failed", "expired", "cancelled"})
COUNTERS = ("total", "completed", "failed", "input_tokens", "output_tokens")
TIMESTAMPS = (
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)
# OpenAI's limits on the requests in one batch, and on its input file's size.
MAX_LINES = 50_000
MAX_INPUT_BYTES = 200 * 1024 * 1024
COMPLETION_WINDOW_S = 24 * 3600


class BatchCreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: Annotated[str, Field(pattern=ID_PATTERN)]
    endpoint: OpenAIEndpoint
    completion_window: Literal["24h"]
    metadata: Metadata | None = None
    output_expires_after: ExpiresAfter | None = None


class BatchRequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchError(BaseModel):
    code: str
    line: int | None = None
    message: str
    param: str | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class StoredBatch(BaseModel):
    """What is fixed when a batch is created."""

    id: str
    created_at: int
    expires_at: int
    endpoint: Endpoint
    input_file_id: str
    completion_window: Literal["24h"] = "24h"
    metadata: dict[str, str] | None = None
    models: list[str] = []
    output_expires_after: ExpiresAfter | None = None


class Batch(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None = None
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: BatchRequestCounts
    metadata: dict[str, str] | None = None
    usage: ResponseUsage | None = None

    @classmethod
    def of(cls, stored: StoredBatch, fields: dict[str, str]) -> Batch:
        """The batch object from its stored record and its hash's other fields."""
        count = {name: int(fields.get(name) or 0) for name in COUNTERS}
        times = {name: int(fields[name]) for name in TIMESTAMPS if fields.get(name)}
        errors = fields.get("errors")
        return cls(
            id=stored.id,
            endpoint=stored.endpoint,
            model=stored.models[0] if len(stored.models) == 1 else None,
            errors=BatchErrors.model_validate_json(errors) if errors else None,
            input_file_id=stored.input_file_id,
            completion_window=stored.completion_window,
            status=fields.get("status", "validating"),
            output_file_id=fields.get("output_file_id") or None,
            error_file_id=fields.get("error_file_id") or None,
            created_at=stored.created_at,
            expires_at=stored.expires_at,
            request_counts=BatchRequestCounts(
                total=count["total"], completed=count["completed"], failed=count["failed"]
            ),
            metadata=stored.metadata,
            usage=ResponseUsage(
                input_tokens=count["input_tokens"],
                output_tokens=count["output_tokens"],
                total_tokens=count["input_tokens"] + count["output_tokens"],
            ),
            **times,
        )


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Batch]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class BatchInputLine(BaseModel):
    """One line of a batch's input file."""

    model_config = ConfigDict(extra="forbid")

    custom_id: Annotated[str, Field(min_length=1, max_length=512)]
    method: Literal["POST"]
    url: str
    body: dict[str, Any]


class LineResponse(BaseModel):
    status_code: int
    request_id: str
    body: dict[str, Any]


class LineError(BaseModel):
    code: str
    message: str


class BatchOutputLine(BaseModel):
    """One line of a batch's output or error file."""

    id: str
    custom_id: str
    response: LineResponse | None
    error: LineError | None

    @classmethod
    def answered(cls, custom_id: str, status_code: int, body: dict[str, Any]) -> BatchOutputLine:
        response = LineResponse(status_code=status_code, request_id=new_id("req_"), body=body)
        return cls(id=new_id("batch_req_"), custom_id=custom_id, response=response, error=None)

    @classmethod
    def unanswered(cls, custom_id: str, code: str, message: str) -> BatchOutputLine:
        error = LineError(code=code, message=message)
        return cls(id=new_id("batch_req_"), custom_id=custom_id, response=None, error=error)


class LineResult(BaseModel):
    """A recorded line: which file it goes to, the line, and the tokens it used."""

    part: Literal["output", "error"]
    line: BatchOutputLine
    input_tokens: int = 0
    output_tokens: int = 0

    @classmethod
    def failed(cls, custom_id: str, status: int, error: ErrorBody) -> LineResult:
        line = BatchOutputLine.answered(custom_id, status, error.model_dump(mode="json"))
        return cls(part="error", line=line)


class BatchLine(BaseModel):
    """Set on a batch line's generation job: where its answer is recorded, and its request."""

    batch_id: str
    index: int
    custom_id: str
    endpoint: Endpoint
    body: dict[str, Any]
    # The end of the batch's completion window: a line still queued then is not run.
    expires_at: int

    def job_id(self) -> str:
        return line_job_id(self.batch_id, self.index)


def line_job_prefix(batch_id: str) -> str:
    """What the RQ job id of each of a batch's lines starts with."""
    return f"{batch_id}-"


def line_job_id(batch_id: str, index: int) -> str:
    return f"{line_job_prefix(batch_id)}{index}"


def answer_body(
    endpoint: Endpoint, body: dict[str, Any], got: Transcripts, done: DoneEvent, created: int
) -> BaseModel:
    """The body the endpoint answers for this request, what the job produced and its end."""
    model = REQUEST_MODELS[endpoint].model_validate(body, strict=True)
    if isinstance(model, MessagesRequest):
        chat = model.chat_request()
        return message(chat_completion(chat, new_id("msg_"), created, got, done), done)
    if isinstance(model, ChatCompletionRequest):
        return chat_completion(model, new_id("chatcmpl-"), created, got, done)
    if isinstance(model, CompletionRequest):
        return text_completion(model, new_id("cmpl-"), created, got, done)
    stored = StoredResponse(id=new_id("resp_"), created_at=created, background=False, request=model)
    progress = Progress.finished(got.choice(0), done)
    return render(stored, progress, progress.status())


class BatchListQuery(BaseModel):
    """The query of GET /v1/batches (newest first, as OpenAI lists them)."""

    model_config = ConfigDict(extra="forbid")

    after: Annotated[str, Field(pattern=ID_PATTERN)] | None = None
    limit: int = Field(default=20, ge=1, le=100)
