"""The one exception hierarchy of mlxq and OpenAI's error body.

Every failure a client can see is an `MLXQError` subclass carrying the HTTP status and the
OpenAI error `type`/`code`; the API turns it into `{"error": {...}}` in one place
(`api/http/errors.py`), and the worker sends the same `ErrorBody` on a job's channel.
"""

from __future__ import annotations

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    """The inner object of OpenAI's error body."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`."""

    error: ErrorDetail


class MLXQError(Exception):
    """Base of every error a client may see; carries its HTTP status and OpenAI fields."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def headers(self) -> dict[str, str]:
        """HTTP headers that go with this error's response (none by default)."""
        return {}

    def detail(self) -> ErrorDetail:
        return ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)

    def body(self) -> ErrorBody:
        return ErrorBody(error=self.detail())


class InvalidRequestError(MLXQError):
    """The request is malformed or asks for something we do not support (400)."""

    status = 400
    type = "invalid_request_error"


class InvalidJSONError(InvalidRequestError):
    """The body is not one well-formed JSON document (400)."""

    code = "invalid_json"


class UnsupportedMediaTypeError(InvalidRequestError):
    """The body is not declared as JSON (415)."""

    status = 415
    code = "unsupported_media_type"


class UnsupportedParameterError(InvalidRequestError):
    """An OpenAI parameter we do not implement was given a non-default value (400)."""

    code = "unsupported_parameter"


class ContextLengthError(InvalidRequestError):
    """Prompt plus requested tokens do not fit the model's context window (400)."""

    code = "context_length_exceeded"


class InvalidKeyPartError(InvalidRequestError):
    """A model name or id that is not safe to put inside a Redis key (400)."""

    code = "invalid_value"


class AuthenticationError(MLXQError):
    """No API key, or a wrong one, on a route that needs one (401)."""

    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class ForbiddenError(MLXQError):
    """Refused for where the request comes from: its peer, Host or Origin (403;
    api/http/exposure.py)."""

    status = 403
    type = "request_forbidden"


class PermissionDeniedError(MLXQError):
    """The caller's key may not do this: an operator's only (403)."""

    status = 403
    type = "permission_error"
    code = "permission_denied"


class NotFoundError(MLXQError):
    """An unknown route or resource (404)."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFoundError(NotFoundError):
    """No live worker serves the requested model (404)."""

    code = "model_not_found"


class MethodNotAllowedError(MLXQError):
    """The route exists but not for this HTTP method (405)."""

    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class PayloadTooLargeError(MLXQError):
    """An upload is larger than its cap (413)."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class IdempotencyKeyInUseError(MLXQError):
    """The first request with this Idempotency-Key has not been answered yet; retry (409)."""

    status = 409
    type = "invalid_request_error"
    code = "idempotency_key_in_use"

    def __init__(self, message: str, *, param: str | None = None, retry_after_s: int = 1):
        super().__init__(message, param=param)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class IdempotencyKeyReusedError(MLXQError):
    """The Idempotency-Key was first sent with another request (422)."""

    status = 422
    type = "invalid_request_error"
    code = "idempotency_key_reused"


class RateLimitError(MLXQError):
    """The API key is over its requests or tokens per minute (429). `retry_after_ms` None: the
    request alone is over the limit and no wait helps (the OpenAI SDK is told not to retry)."""

    status = 429
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, kind: str, retry_after_ms: int | None):
        super().__init__(message)
        self.type = kind  # "requests" or "tokens", as OpenAI names them
        self.retry_after_ms = retry_after_ms

    def headers(self) -> dict[str, str]:
        if self.retry_after_ms is None:
            return {"x-should-retry": "false"}
        return {
            "Retry-After": str(max(1, -(-self.retry_after_ms // 1000))),
            "retry-after-ms": str(self.retry_after_ms),
        }


class QuotaExceededError(MLXQError):
    """The API key keeps as much of something as its quota allows (files, their bytes, stored
    responses, batches, Idempotency-Keys): nothing more until some is deleted or expires (429).
    OpenAI's `insufficient_quota`, its status and code for a quota that waiting does not
    restore; the SDKs are told not to retry."""

    status = 429
    type = "insufficient_quota"
    code = "insufficient_quota"

    def headers(self) -> dict[str, str]:
        return {"x-should-retry": "false"}


class QueueFullError(MLXQError):
    """The model's queue is over its cap of jobs or of prompt tokens; retry later (429)."""

    status = 429
    type = "rate_limit_error"
    code = "queue_full"

    def __init__(self, message: str, *, retry_after_s: int, code: str | None = None):
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class BackendUnavailableError(MLXQError):
    """Redis cannot be reached (503)."""

    status = 503
    type = "server_error"
    code = "backend_unavailable"


class WorkerLostError(MLXQError):
    """The worker running the job died, hung or was shut down before it finished (503)."""

    status = 503
    type = "server_error"
    code = "worker_lost"


class ClientClosedError(MLXQError):
    """The client closed its connection before its job started (nginx's 499): nobody reads
    this answer; it ends the request and withdraws the job."""

    status = 499
    type = "client_closed_request"
    code = "client_closed_request"


class QueueTimeoutError(MLXQError):
    """The job waited in the queue past its deadline and was not started (503)."""

    status = 503
    type = "server_error"
    code = "queue_timeout"


class GenerationTimeoutError(MLXQError):
    """The generation ran past its time limit (504), when the limit is set to end in an error."""

    status = 504
    type = "server_error"
    code = "generation_timeout"


class GenerationError(MLXQError):
    """The worker failed while generating (500); the message says why."""

    status = 500
    type = "server_error"
    code = "generation_failed"


class ModelLoadError(MLXQError):
    """The model's worker failed to start (corrupt weights, killed while loading) before it took
    the job (503); the message names the model and says why."""

    status = 503
    type = "server_error"
    code = "model_load_failed"


class ModelImportError(Exception):
    """A model file cannot be imported (unsupported architecture, tensor type, tokenizer)."""


def error_from_detail(status: int, detail: ErrorDetail) -> MLXQError:
    """Rebuild an error that crossed a process boundary (a worker's ErrorEvent)."""
    err = MLXQError(detail.message, param=detail.param, code=detail.code)
    err.status = status
    err.type = detail.type
    return err
