"""The one translation point from any failure to OpenAI's error body (or, on the routes of
Anthropic's Messages API, to Anthropic's: shared/wire/anthropic/message_answers.py maps one onto the
other).

MLXQError carries its own status; pydantic's ValidationError becomes a 400 naming the first
offending parameter; a RedisError is a 503; Werkzeug's HTTP errors (404, 405, 413, ...) keep
their status; anything unexpected is logged and answered 500 without a traceback.
"""

from __future__ import annotations

import logging

from flask import Flask, Response, current_app, has_request_context, jsonify, request
from pydantic import ValidationError
from pydantic_core import ErrorDetails
from redis.exceptions import RedisError
from werkzeug.exceptions import HTTPException

from shared.queue.connection import unavailable
from shared.wire.anthropic.message_answers import anthropic_error
from shared.wire.anthropic.messages import MESSAGES_PATH
from shared.wire.errors import (
    ErrorBody,
    ErrorDetail,
    MethodNotAllowedError,
    MLXQError,
    NotFoundError,
    PayloadTooLargeError,
)

log = logging.getLogger(__name__)


def speaks_anthropic() -> bool:
    """Whether the current request is to a route of Anthropic's Messages API."""
    path = request.path if has_request_context() else ""
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def error_response(status: int, detail: ErrorDetail) -> tuple[Response, int]:
    if speaks_anthropic():
        status, body = anthropic_error(status, detail)
        return jsonify(body.model_dump(mode="json")), status
    return jsonify(ErrorBody(error=detail).model_dump(mode="json")), status


def _is_union_tag(part: str | int) -> bool:
    """pydantic names the union member it tried ('str', 'list[str]') inside error locations."""
    return isinstance(part, str) and (
        "[" in part or "-" in part or part in {"str", "int", "float", "bool", "list", "dict"}
    )


def _param(error: ErrorDetails) -> str | None:
    loc = [str(part) for part in error["loc"] if not _is_union_tag(part)]
    return ".".join(loc) or None


def _most_specific(err: ValidationError) -> ErrorDetails:
    """Of the errors about the first bad field, the one deepest inside it (a limit or a value
    rather than a union member's type mismatch when they are as deep)."""
    errors = err.errors(include_url=False)
    field = errors[0]["loc"][:1]
    return max(
        (e for e in errors if e["loc"][:1] == field),
        key=lambda e: (len(e["loc"]), not e["type"].endswith("_type")),
    )


def _length(error: ErrorDetails) -> object:
    ctx = error.get("ctx") or {}
    given = error.get("input")
    return ctx.get("actual_length", len(given) if isinstance(given, str | list) else "more")


def _shown(value: object) -> str:
    try:
        text = str(value)
    except ValueError:  # an integer too long to print
        return "a longer number"
    return text if len(text) <= 40 else text[:40] + "..."


def _limit(error: ErrorDetails) -> tuple[str, str] | None:
    """OpenAI's code and message for a size or range limit, or None for other errors."""
    param, ctx, kind = _param(error), error.get("ctx") or {}, error["type"]
    number = "integer" if isinstance(error.get("input"), int) else "decimal"
    if kind == "too_long":
        return "array_above_max_length", (
            f"Invalid '{param}': array too long. Expected an array with maximum length "
            f"{ctx.get('max_length')}, but got an array with length {_length(error)} instead."
        )
    if kind == "string_too_long":
        return "string_above_max_length", (
            f"Invalid '{param}': string too long. Expected a string with maximum length "
            f"{ctx.get('max_length')}, but got a string with length {_length(error)} instead."
        )
    if kind in _BOUNDS:
        side, relation, key = _BOUNDS[kind]
        return f"{number}_{side}_{'max' if side == 'above' else 'min'}_value", (
            f"Invalid '{param}': {number} {side} {'maximum' if side == 'above' else 'minimum'} "
            f"value. Expected a value {relation} {ctx.get(key)}, but got "
            f"{_shown(error.get('input'))} instead."
        )
    return None


# pydantic's range error types: the side of the bound the value fell, the relation it broke, and
# the context key holding the bound.
_BOUNDS = {
    "less_than_equal": ("above", "<=", "le"),
    "less_than": ("above", "<", "lt"),
    "greater_than_equal": ("below", ">=", "ge"),
    "greater_than": ("below", ">", "gt"),
}


def _validation_message(error: ErrorDetails) -> str:
    param = _param(error)
    if error["type"] == "extra_forbidden":
        return f"Unrecognized request argument supplied: {param}"
    if error["type"] == "json_invalid":
        return "We could not parse the JSON body of your request: it is not valid JSON."
    if error["type"] == "model_type" and not error["loc"]:
        return "The request body must be a JSON object."
    return f"Invalid value for '{param}': {error['msg']}" if param else error["msg"]


def handle_mlxq(err: MLXQError) -> tuple[Response, int]:
    response, status = error_response(err.status, err.detail())
    response.headers.update(err.headers())
    return response, status


def validation_detail(err: ValidationError) -> ErrorDetail:
    """OpenAI's error object for invalid input (also used for a batch's bad lines)."""
    first = _most_specific(err)
    code = "invalid_json" if first["type"] == "json_invalid" else "invalid_value"
    message = _validation_message(first)
    limit = _limit(first)
    if limit is not None:
        code, message = limit
    return ErrorDetail(
        message=message,
        type="invalid_request_error",
        param=_param(first),
        code=code,
    )


def handle_validation(err: ValidationError) -> tuple[Response, int]:
    return error_response(400, validation_detail(err))


def _http_message(err: HTTPException) -> str:
    if err.code == 413:
        limit = current_app.config.get("MAX_CONTENT_LENGTH")
        return f"The request body is too large: at most {limit} bytes are accepted."
    return err.description or err.name


# Werkzeug's HTTP errors that have an mlxq error class: their code is the class's.
_HTTP_ERRORS: dict[int, type[MLXQError]] = {
    404: NotFoundError,
    405: MethodNotAllowedError,
    413: PayloadTooLargeError,
}


def handle_http(err: HTTPException) -> tuple[Response, int]:
    status = err.code or 500
    known = _HTTP_ERRORS.get(status)
    detail = ErrorDetail(
        message=_http_message(err),
        type="invalid_request_error" if status < 500 else "server_error",
        code=known.code if known is not None else err.name.lower().replace(" ", "_"),
    )
    response, status = error_response(status, detail)
    for name, value in err.get_headers():  # a 405 says which methods are allowed (Allow)
        if name.lower() != "content-type":
            response.headers[name] = value
    return response, status


def handle_redis(err: RedisError) -> tuple[Response, int]:
    return handle_mlxq(unavailable(err))


def handle_unexpected(err: Exception) -> tuple[Response, int]:
    log.exception("unexpected error")
    detail = ErrorDetail(message="The server had an internal error.", type="server_error")
    return error_response(500, detail)


def init_app(app: Flask) -> None:
    app.register_error_handler(MLXQError, handle_mlxq)
    app.register_error_handler(ValidationError, handle_validation)
    app.register_error_handler(HTTPException, handle_http)
    app.register_error_handler(RedisError, handle_redis)
    app.register_error_handler(Exception, handle_unexpected)
