"""A batch's input lines, validated one at a time into the jobs to run (OpenAI's rules).

The intake process (api/stores/batch_feed.py) feeds every line of the input to `Intake.take` and
cuts what passed into chunks (`Intake.cut`) that it queues at once, so a batch runs while its later
lines are still being read. The whole batch fails validation, with `errors` (code, line, message)
filled in, when the file is not UTF-8 JSONL, a line is not `{custom_id, method, url, body}`, a
custom_id repeats, a url is not the batch's endpoint, a model is served by no live worker, or the
file is empty; a line past MLXQ_BATCH_MAX_LINES (OpenAI's 50,000) fails it as it is reached. A line
whose body the endpoint would refuse (a bad parameter, `stream`, a model of the wrong kind: an
embedding model asked for a chat, shared/queue/model_kinds.py) fails alone: its error line (status
400 and OpenAI's error body) is recorded with its chunk, so no batch waits on a job no worker can
take; bodies pass the same checks as a request's (no NUL characters, finite numbers:
api/http/validation.py). Blank lines are skipped; line numbers count every line of the file from 1.
A message batch (Anthropic's) names no model a whole batch fails for: its request for a model
nobody serves ends alone, `errored`, as Anthropic's does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pydantic_core
from pydantic import ValidationError

from api.http.errors import validation_detail
from api.http.validation import check_values
from shared.queue.jobs import GenerationJob, job_for
from shared.queue.model_kinds import refuse_wrong_kind
from shared.wire.batch.batches import (
    MAX_LINES,
    REQUEST_MODELS,
    BatchError,
    BatchInputLine,
    BatchLine,
    Endpoint,
    LineResult,
    StoredBatch,
    line_job_id,
)
from shared.wire.errors import (
    ErrorBody,
    InvalidRequestError,
    MLXQError,
    ModelNotFoundError,
    UnsupportedParameterError,
)
from shared.wire.fleet.catalog import ModelKind

# Errors kept on a batch that failed validation.
MAX_ERRORS = 100


@dataclass
class Chunk:
    """What passed intake since the last cut: the lines' custom_ids in input order (their
    indexes follow on from the batch's earlier chunks), their jobs, and the lines refused
    alone (by index)."""

    custom_ids: list[str] = field(default_factory=list)
    jobs: list[GenerationJob] = field(default_factory=list)
    refused: dict[int, LineResult] = field(default_factory=dict)


@dataclass
class Intake:
    batch: StoredBatch
    owner: str  # who created the batch: each line's job carries it
    cache_scope: str  # its key's (api/http/auth.py), which each line's job carries too
    models: LineModels
    messages: bool = False  # Anthropic's: a model nobody serves fails its request alone
    max_lines: int = MAX_LINES  # MLXQ_BATCH_MAX_LINES
    requests: int = 0  # lines taken so far, the next line's index
    chunk: Chunk = field(default_factory=Chunk)
    errors: list[BatchError] = field(default_factory=list)
    named: set[str] = field(default_factory=set)  # the models the lines name
    seen: set[str] = field(default_factory=set)

    def fail(self, code: str, line: int | None, message: str, param: str | None = None) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(BatchError(code=code, line=line, message=message, param=param))

    def take(self, number: int, raw: bytes | str) -> None:
        """Check line `number` of the input; a blank line is skipped."""
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError:
                self.fail("invalid_file", number, "The input file is not UTF-8 text.")
                return
        if raw.strip():
            _take_line(self, number, raw)

    def end(self) -> None:
        """The input has no more lines."""
        if not self.requests and not self.errors:
            self.fail("empty_file", None, "The input file has no requests.")

    def cut(self) -> Chunk:
        """What passed since the last cut, to queue now."""
        chunk, self.chunk = self.chunk, Chunk()
        return chunk


@dataclass
class LineModels:
    """The fleet's answers about the lines' models, asked once per model: whether a live
    worker serves it (`is_served`) and, if one does, what kind of model it is (`kind_of`)."""

    is_served: Callable[[str], bool]
    kind_of: Callable[[str], ModelKind | None]
    _known: dict[str, tuple[bool, ModelKind | None]] = field(default_factory=dict)

    def look_up(self, model: str) -> tuple[bool, ModelKind | None]:
        if model not in self._known:
            served = self.is_served(model)
            self._known[model] = (served, self.kind_of(model) if served else None)
        return self._known[model]


def _take_line(intake: Intake, number: int, raw: str) -> None:
    line = _parse_line(intake, number, raw)
    if line is None:
        return
    intake.requests += 1
    if intake.requests > intake.max_lines:
        intake.fail(
            "too_many_requests",
            number,
            f"A batch holds at most {intake.max_lines} requests: line {number} is one more.",
        )
        return
    batch = intake.batch
    if line.custom_id in intake.seen:
        intake.fail(
            "duplicate_custom_id",
            number,
            f"The custom_id '{line.custom_id}' appears more than once.",
            "custom_id",
        )
    intake.chunk.custom_ids.append(line.custom_id)
    intake.seen.add(line.custom_id)
    if line.url != batch.endpoint:
        intake.fail(
            "invalid_url",
            number,
            f"The url '{line.url}' does not match the batch's endpoint '{batch.endpoint}'.",
            "url",
        )
    model = line.body.get("model")
    served, kind = True, None
    if isinstance(model, str):
        served, kind = intake.models.look_up(model)
        if not served and not intake.messages:
            intake.fail(
                "model_not_found",
                number,
                f"The model '{model}' does not exist or no live worker serves it.",
                "body.model",
            )
        intake.named.add(model)
    if not intake.errors:
        _take_request(intake, line, served, kind)


def _parse_line(intake: Intake, number: int, raw: str) -> BatchInputLine | None:
    try:
        data = pydantic_core.from_json(raw, allow_inf_nan=False)
    except ValueError:
        intake.fail("invalid_json_line", number, f"Line {number} is not valid JSON.")
        return None
    try:
        return BatchInputLine.model_validate(data)
    except ValidationError as err:
        detail = validation_detail(err)
        intake.fail(
            "invalid_request",
            number,
            f"Line {number} is not a batch request ({{custom_id, method, url, body}}): "
            f"{detail.message}",
            detail.param,
        )
        return None


def _take_request(
    intake: Intake, line: BatchInputLine, served: bool, kind: ModelKind | None
) -> None:
    """Take a line's request as its job, or record its error line (`served`, `kind`: whether
    a live worker serves its model, and what kind of model it is)."""
    batch, index = intake.batch, intake.requests - 1
    try:
        check_values(line.body)
        body = _batchable(batch.endpoint, line.body)
        request = REQUEST_MODELS[batch.endpoint].model_validate(body, strict=True)
        # Its owner's fair share: the batch lane takes its callers in turn (shared/queue/turns.py).
        job_id = line_job_id(batch.id, index)
        job = job_for(job_id, request, intake.owner, scope=intake.cache_scope)
        if not served:
            raise ModelNotFoundError(
                f"The model '{job.model}' does not exist or no live worker serves it.",
                param="model",
            )
        refuse_wrong_kind(job, kind)
        if job.keep_alive_s is not None:
            raise InvalidRequestError(
                "keep_alive is not taken in batch lines: a batch does not decide how long a model "
                "every key shares stays loaded",
                param="keep_alive",
            )
    except ValidationError as err:
        error = ErrorBody(error=validation_detail(err))
        intake.chunk.refused[index] = LineResult.failed(line.custom_id, 400, error)
        return
    except MLXQError as err:
        intake.chunk.refused[index] = LineResult.failed(line.custom_id, err.status, err.body())
        return
    record = BatchLine(
        batch_id=batch.id,
        index=index,
        custom_id=line.custom_id,
        endpoint=batch.endpoint,
        body=body,
        expires_at=batch.expires_at,
    )
    intake.chunk.jobs.append(job.model_copy(update={"batch_line": record}))


def _batchable(endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
    """A line's body, refusing what a batch cannot do; a /v1/responses line is not stored."""
    if body.get("stream"):
        raise UnsupportedParameterError("stream is not supported in a batch", param="stream")
    if endpoint != "/v1/responses":
        return body
    if body.get("background"):
        raise UnsupportedParameterError(
            "background is not supported in a batch", param="background"
        )
    if body.get("store"):
        raise InvalidRequestError(
            "A batch's responses are answered in its output file, not stored: "
            "leave store unset or false.",
            param="store",
        )
    return {**body, "store": False}
