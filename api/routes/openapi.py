"""GET /openapi.json: the API described as OpenAPI 3.1, generated from the pydantic wire models.

`ROUTES` lists every route with its request and response models (those in shared/); the
`openapi-pydantic` library types the document and turns the models into JSON Schema components
(through pydantic's own generator), so the document cannot drift from what the routes validate.
A test checks that every rule in Flask's URL map is documented. The document is public (it holds
nothing private), like /health; every /v1 route needs the bearer key when keys are configured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache

from flask import Blueprint, Response
from openapi_pydantic import (
    Components,
    Header,
    Info,
    MediaType,
    OpenAPI,
    Operation,
    Parameter,
    PathItem,
    Reference,
    RequestBody,
    Schema,
    SecurityScheme,
)
from openapi_pydantic import Response as OpenAPIResponse
from openapi_pydantic.util import PydanticSchema, construct_open_api_with_schema_class
from pydantic import BaseModel

from shared.observe.fleet import FleetSnapshot
from shared.observe.history import FleetHistory
from shared.observe.metrics import RECENT_JOBS
from shared.wire.anthropic.message_answers import AnthropicErrorBody, Message, MessageStreamEvent
from shared.wire.anthropic.message_batches import (
    DeletedMessageBatch,
    MessageBatch,
    MessageBatchCreate,
    MessageBatchList,
)
from shared.wire.anthropic.messages import (
    ANTHROPIC_VERSION_PATTERN,
    MessagesInput,
    MessagesRequest,
    TokenCount,
)
from shared.wire.batch.batches import Batch, BatchCreateRequest, BatchList
from shared.wire.batch.files import FileDeleted, FileList, FileObject, FileUpload
from shared.wire.chat.answers import ChatCompletion, ChatCompletionChunk, Completion
from shared.wire.chat.completions import ChatCompletionRequest, CompletionRequest
from shared.wire.embeddings import EmbeddingList, EmbeddingRequest
from shared.wire.errors import ErrorBody
from shared.wire.fleet.catalog import Health, ModelCard, ModelList
from shared.wire.ids import ID_PATTERN, MODEL_NAME_PATTERN
from shared.wire.responses.response_events import ResponseStreamEvent
from shared.wire.responses.responses import ResponseDeleted, ResponseObject, ResponsesRequest

bp = Blueprint("openapi", __name__)

# Why each error status can happen, on the routes where it can.
ERRORS = {
    400: "Invalid request: OpenAI's error body names the parameter and code",
    401: "Missing or wrong API key (`invalid_api_key`), when keys are configured",
    403: "Refused for where the request comes from: an API without keys serves its own machine "
    "only (`loopback_only`, `host_not_allowed`, `origin_not_allowed`), and one with "
    "MLXQ_ALLOWED_HOSTS those hosts only (api/http/exposure.py)",
    404: "Unknown model (`model_not_found`), route, response, file or batch",
    405: "Method not allowed",
    413: "Request body too large",
    415: "The body is not declared as JSON",
    429: "The model's queue is full (`queue_full`), the API key is over its requests or "
    "tokens per minute, its queued tokens or its open background responses or batches "
    "(`rate_limit_exceeded`), or it keeps as much as its quotas allow (`insufficient_quota`: "
    "files, their bytes, stored responses, batches, Idempotency-Keys; docs/operations.md)",
    500: "The worker failed while generating",
    503: "Redis is unreachable (`backend_unavailable`)",
    529: "Overloaded: the model's queue is full, or the job was not started by its deadline "
    "(Anthropic's `overloaded_error`)",
}
EXPOSURE_ERROR = 403
GENERATION_ERRORS = (400, 401, 404, 405, 413, 415, 429, 500, 503)
READ_ERRORS = (401, 404, 405, 503)
# Stored resources: an id or query that is not well-formed is a 400.
RESOURCE_ERRORS = (400, 401, 404, 405, 503)
LIST_ERRORS = (400, 401, 405, 503)
# Anthropic's Messages API: its error body, and 529 where OpenAI's routes answer a full queue.
MESSAGE_ERRORS = (400, 401, 404, 405, 413, 415, 429, 500, 503, 529)
# The headers of api/limits/rates.py: the per-minute state on every answer to a key with
# such limits, and when to retry on a 429.
RATE_LIMIT_STATE = {
    f"x-ratelimit-{part}-{kind}": what.format(kind=kind)
    for kind in ("requests", "tokens")
    for part, what in (
        ("limit", "The key's {kind} per minute"),
        ("remaining", "The {kind} left in the key's bucket"),
        ("reset", "Until the {kind} bucket is full again (`1s`, `6m0s`, `20ms`)"),
    )
}
RETRY = {
    "Retry-After": "Seconds until the request would be admitted",
    "retry-after-ms": "The same in milliseconds (rate limits)",
    "x-should-retry": "`false`: the request alone is over a limit and no wait helps",
}


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # OpenAPI's path template
    summary: str
    response: type[BaseModel] | None  # None: any JSON object
    request: type[BaseModel] | None = None
    chunk: type[BaseModel] | None = None  # the stream's event model, for stream=true
    errors: tuple[int, ...] = READ_ERRORS
    parameters: list[Parameter] = field(default_factory=list)
    public: bool = False
    form: type[BaseModel] | None = None  # a multipart/form-data request body
    binary: bool = False  # the answer is the raw bytes of a file
    text: str | None = None  # the answer is text of this media type
    error_body: type[BaseModel] = ErrorBody  # Anthropic's on its routes


MODEL_ID = Parameter.model_validate(
    {
        "name": "model_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": MODEL_NAME_PATTERN},
    }
)


def _param(name: str, where: str, schema: dict[str, object], required: bool = False) -> Parameter:
    return Parameter.model_validate(
        {"name": name, "in": where, "required": required or where == "path", "schema": schema}
    )


def _id(name: str) -> Parameter:
    return _param(name, "path", {"type": "string", "pattern": ID_PATTERN})


def _after() -> Parameter:
    return _param("after", "query", {"type": "string", "pattern": ID_PATTERN})


def _limit(maximum: int) -> Parameter:
    return _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": maximum})


ANTHROPIC_VERSION = _param(
    "anthropic-version", "header", {"type": "string", "pattern": ANTHROPIC_VERSION_PATTERN}
)
RESPONSE_ID, FILE_ID, BATCH_ID = _id("response_id"), _id("file_id"), _id("batch_id")
RETRIEVE_RESPONSE = [
    RESPONSE_ID,
    _param("stream", "query", {"type": "boolean"}),
    _param("starting_after", "query", {"type": "integer", "minimum": -1}),
]
LIST_FILES = [
    _after(),
    _limit(10_000),
    _param("order", "query", {"enum": ["asc", "desc"]}),
    _param("purpose", "query", {"enum": ["batch", "batch_output"]}),
]
ROUTES = [
    Route("post", "/v1/chat/completions", "Create a chat completion", ChatCompletion,
          ChatCompletionRequest, ChatCompletionChunk, errors=GENERATION_ERRORS),
    Route("post", "/v1/completions", "Create a text completion", Completion,
          CompletionRequest, Completion, errors=GENERATION_ERRORS),
    Route("post", "/v1/embeddings", "Create embeddings", EmbeddingList, EmbeddingRequest,
          errors=GENERATION_ERRORS),
    Route("get", "/v1/models", "List the models live workers serve", ModelList),
    Route("get", "/v1/models/{model_id}", "Retrieve a model", ModelCard, parameters=[MODEL_ID]),
    Route("get", "/health", "Liveness: Redis answers; the live models", Health,
          errors=(405, 503), public=True),
    Route("get", "/openapi.json", "This document", None, errors=(405,), public=True),
    Route("get", "/metrics", "The whole fleet's metrics in Prometheus' text format", None,
          errors=(401, 405, 503), text="text/plain"),
    Route("get", "/v1/fleet", "The fleet now: live workers, queues per lane, recent jobs",
          FleetSnapshot, errors=LIST_ERRORS, parameters=[
              _param("recent", "query", {"type": "integer", "minimum": 0, "maximum": RECENT_JOBS})
          ]),
    Route("get", "/v1/fleet/history", "The fleet's samples of the last 15 minutes, oldest first",
          FleetHistory, errors=LIST_ERRORS, parameters=[
              _param("since", "query", {"type": "number", "minimum": 0})
          ]),
    Route("get", "/", "The web page: fleet view and chat playground", None, errors=(405,),
          public=True, text="text/html"),
    Route("post", "/v1/responses", "Create a response (sync, streamed or background)",
          ResponseObject, ResponsesRequest, ResponseStreamEvent, errors=GENERATION_ERRORS),
    Route("get", "/v1/responses/{response_id}", "Retrieve a stored response, or stream its "
          "events after a sequence number", ResponseObject, chunk=ResponseStreamEvent,
          errors=RESOURCE_ERRORS, parameters=RETRIEVE_RESPONSE),
    Route("delete", "/v1/responses/{response_id}", "Delete a stored response", ResponseDeleted,
          errors=RESOURCE_ERRORS, parameters=[RESPONSE_ID]),
    Route("post", "/v1/responses/{response_id}/cancel", "Cancel a background response",
          ResponseObject, errors=RESOURCE_ERRORS, parameters=[RESPONSE_ID]),
    Route("post", "/v1/files", "Upload a file (purpose batch)", FileObject, form=FileUpload,
          errors=(400, 401, 405, 413, 429, 503)),
    Route("get", "/v1/files", "List files", FileList, errors=LIST_ERRORS, parameters=LIST_FILES),
    Route("get", "/v1/files/{file_id}", "Retrieve a file", FileObject, errors=RESOURCE_ERRORS,
          parameters=[FILE_ID]),
    Route("delete", "/v1/files/{file_id}", "Delete a file", FileDeleted, errors=RESOURCE_ERRORS,
          parameters=[FILE_ID]),
    Route("get", "/v1/files/{file_id}/content", "A file's content", None, binary=True,
          errors=RESOURCE_ERRORS, parameters=[FILE_ID]),
    Route("post", "/v1/batches", "Create a batch from an uploaded JSONL file", Batch,
          BatchCreateRequest, errors=(400, 401, 404, 405, 413, 415, 429, 503)),
    Route("get", "/v1/batches", "List batches, newest first", BatchList, errors=LIST_ERRORS,
          parameters=[_after(), _limit(100)]),
    Route("get", "/v1/batches/{batch_id}", "Retrieve a batch", Batch, errors=RESOURCE_ERRORS,
          parameters=[BATCH_ID]),
    Route("post", "/v1/batches/{batch_id}/cancel", "Cancel a batch", Batch,
          errors=RESOURCE_ERRORS, parameters=[BATCH_ID]),
    Route("post", "/v1/messages", "Create a message (Anthropic's Messages API)", Message,
          MessagesRequest, MessageStreamEvent, errors=MESSAGE_ERRORS,
          parameters=[ANTHROPIC_VERSION], error_body=AnthropicErrorBody),
    Route("post", "/v1/messages/count_tokens", "Count a message's input tokens", TokenCount,
          MessagesInput, errors=(400, 401, 404, 405, 413, 415, 503),
          parameters=[ANTHROPIC_VERSION], error_body=AnthropicErrorBody),
    Route("post", "/v1/messages/batches", "Create a message batch (Anthropic's)", MessageBatch,
          MessageBatchCreate, errors=(400, 401, 405, 413, 415, 429, 503),
          parameters=[ANTHROPIC_VERSION], error_body=AnthropicErrorBody),
    Route("get", "/v1/messages/batches", "List message batches, newest first",
          MessageBatchList, errors=LIST_ERRORS, error_body=AnthropicErrorBody,
          parameters=[ANTHROPIC_VERSION, _param("after_id", "query", {"type": "string",
                      "pattern": ID_PATTERN}), _limit(1000)]),
    Route("get", "/v1/messages/batches/{batch_id}", "Retrieve a message batch", MessageBatch,
          errors=RESOURCE_ERRORS, parameters=[ANTHROPIC_VERSION, BATCH_ID],
          error_body=AnthropicErrorBody),
    Route("post", "/v1/messages/batches/{batch_id}/cancel", "Cancel a message batch",
          MessageBatch, errors=RESOURCE_ERRORS, parameters=[ANTHROPIC_VERSION, BATCH_ID],
          error_body=AnthropicErrorBody),
    Route("delete", "/v1/messages/batches/{batch_id}", "Delete an ended message batch",
          DeletedMessageBatch, errors=RESOURCE_ERRORS, parameters=[ANTHROPIC_VERSION, BATCH_ID],
          error_body=AnthropicErrorBody),
    Route("get", "/v1/messages/batches/{batch_id}/results", "An ended message batch's results "
          "(JSONL of IndividualResponse lines)", None, errors=RESOURCE_ERRORS,
          parameters=[ANTHROPIC_VERSION, BATCH_ID], error_body=AnthropicErrorBody,
          text="application/x-jsonl"),
]  # fmt: skip


def _json(schema: Schema) -> dict[str, MediaType]:
    return {"application/json": MediaType(media_type_schema=schema)}


def _sse_event(chunk: type[BaseModel], error_body: type[BaseModel]) -> Schema:
    """One server-sent event of a stream: a chunk, an error object, or the closing [DONE]."""
    payload = Schema(
        contentMediaType="application/json",
        contentSchema=Schema(
            anyOf=[PydanticSchema(schema_class=chunk), PydanticSchema(schema_class=error_body)]
        ),
    )
    if error_body is not ErrorBody:  # Anthropic's stream: named events, no [DONE]
        return Schema(
            type="object",
            description="Each event of the stream (stream=true), named by its type",
            required=["event", "data"],
            properties={"event": Schema(type="string"), "data": payload},
        )
    return Schema(
        type="object",
        description="Each event of the stream (stream=true); keepalive comments in between",
        required=["data"],
        properties={"data": Schema(anyOf=[Schema(const="[DONE]"), payload])},
    )


def _responses(route: Route) -> dict[str, OpenAPIResponse]:
    body = PydanticSchema(schema_class=route.response) if route.response else Schema(type="object")
    content = _json(body)
    if route.binary:
        binary = Schema(type="string", schema_format="binary")
        content = {"application/octet-stream": MediaType(media_type_schema=binary)}
    if route.text is not None:
        content = {route.text: MediaType(media_type_schema=Schema(type="string"))}
    if route.chunk is not None:
        content["text/event-stream"] = MediaType(
            media_type_schema=_sse_event(route.chunk, route.error_body)
        )
    limited = 429 in route.errors
    responses = {
        "200": OpenAPIResponse(
            description="OK",
            content=content,
            headers=_headers(RATE_LIMIT_STATE) if limited else None,
        )
    }
    # Any route may refuse a request for where it comes from (api/http/exposure.py).
    for status in sorted({*route.errors, EXPOSURE_ERROR}):
        responses[str(status)] = OpenAPIResponse(
            description=ERRORS[status],
            content=_json(PydanticSchema(schema_class=route.error_body)),
            headers=_headers({**RETRY, **RATE_LIMIT_STATE}) if status == 429 else None,
        )
    return responses


def _headers(described: dict[str, str]) -> dict[str, Header | Reference]:
    return {
        name: Header.model_validate({"description": what, "schema": {"type": "string"}})
        for name, what in described.items()
    }


def _operation(route: Route) -> Operation:
    request = None
    if route.request is not None:
        request = RequestBody(
            required=True, content=_json(PydanticSchema(schema_class=route.request))
        )
    if route.form is not None:
        form = MediaType(media_type_schema=PydanticSchema(schema_class=route.form))
        request = RequestBody(required=True, content={"multipart/form-data": form})
    return Operation(
        summary=route.summary,
        operationId=f"{route.method}_{route.path.strip('/').replace('/', '_')}",
        parameters=route.parameters or None,
        requestBody=request,
        responses=_responses(route),
        security=[] if route.public else None,
    )


@cache
def document() -> dict[str, object]:
    paths: dict[str, PathItem] = {}
    for route in ROUTES:
        item = paths.setdefault(route.path, PathItem())
        setattr(item, route.method, _operation(route))
    spec = OpenAPI(
        info=Info(
            title="mlxq",
            version="0.1.0",
            description="An OpenAI-compatible LLM service for MLX models, built around a queue.",
        ),
        paths=paths,
        components=Components(
            securitySchemes={"bearer": SecurityScheme(type="http", scheme="bearer")}
        ),
        security=[{"bearer": []}],
    )
    built = construct_open_api_with_schema_class(spec)
    dumped: dict[str, object] = built.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


@bp.get("/openapi.json")
def openapi_json() -> Response:
    return Response(json.dumps(document()), mimetype="application/json")
