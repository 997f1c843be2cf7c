"""/v1/files: upload (multipart, purpose=batch), retrieve, content (streamed), delete, list."""

from __future__ import annotations

from flask import Blueprint, Response, request, stream_with_context
from pydantic import ValidationError

from api.backend import backend
from api.http.auth import owner_id
from api.http.json_response import json_response
from api.limits.quotas import Usage, quotas
from api.limits.shares import takes_a_request
from api.stores.files import FileStore
from api.stores.idempotency import idempotent
from api.stores.listing import parse_query
from shared.wire.batch.files import ExpiresAfter, FileListQuery
from shared.wire.digits import parse_integer
from shared.wire.errors import InvalidRequestError, PayloadTooLargeError, UnsupportedParameterError

bp = Blueprint("files", __name__)

# Room for the multipart framing and the other form fields around the file itself.
FORM_OVERHEAD_BYTES = 64 * 1024
FORM_FIELDS = {"purpose", "expires_after[anchor]", "expires_after[seconds]"}
MAX_FILENAME_CHARS = 255


def store() -> FileStore:
    b = backend()
    return FileStore.of(b.redis, b.keys, b.settings, quotas())


@bp.before_request
def _upload_cap() -> None:
    """An upload may be larger than other bodies: its cap is set before anything reads it. Its
    `Content-Length` is held against the key's quota of files (their count and bytes) before
    the body is read too: a key at its quota does not make the API take in 100 MiB to refuse
    it."""
    if request.endpoint != "files.create_file":
        return
    request.max_content_length = backend().settings.max_file_bytes + FORM_OVERHEAD_BYTES
    # The file is at least the body less the room kept for the form around it.
    at_least = max(0, (request.content_length or 0) - FORM_OVERHEAD_BYTES)
    quotas().ensure_room(owner_id(), Usage("files", "upload", size=at_least), at_least=True)


@bp.post("/v1/files")
@takes_a_request
@idempotent
def create_file() -> Response:
    cap = backend().settings.max_file_bytes
    upload = request.files.get("file")
    if upload is None:
        raise InvalidRequestError("Missing the 'file' form field.", param="file")
    unknown = sorted(str(name) for name in set(request.form) - FORM_FIELDS)
    if unknown:
        raise InvalidRequestError(
            f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0]
        )
    purpose = request.form.get("purpose")
    if purpose != "batch":
        raise UnsupportedParameterError(
            f"purpose {purpose!r} is not supported: only 'batch' is", param="purpose"
        )
    ttl_s = _expires_after_s()
    content = upload.read(cap + 1)
    if len(content) > cap:
        raise PayloadTooLargeError(f"The file is larger than the {cap}-byte limit.", param="file")
    filename = (upload.filename or "upload.jsonl").replace("\x00", "")[:MAX_FILENAME_CHARS]
    created = store().create(owner_id(), filename, "batch", content, ttl_s=ttl_s)
    return json_response(created)


def _expires_after_s() -> int | None:
    anchor = request.form.get("expires_after[anchor]")
    seconds = request.form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    try:
        # The seconds in ASCII digits only: the model's lax mode would take "+3_600.0".
        written = {"anchor": anchor, "seconds": parse_integer(seconds or "")}
        return ExpiresAfter.model_validate(written).seconds
    except ValidationError as err:
        raise InvalidRequestError(
            "expires_after needs anchor 'created_at' and seconds between 3600 and 2592000.",
            param="expires_after",
        ) from err


@bp.get("/v1/files")
def list_files() -> Response:
    return json_response(store().listing(owner_id(), parse_query(FileListQuery)))


@bp.get("/v1/files/<file_id>")
def retrieve_file(file_id: str) -> Response:
    return json_response(store().get(owner_id(), file_id))


@bp.get("/v1/files/<file_id>/content")
def file_content(file_id: str) -> Response:
    """The content, streamed a chunk at a time as Redis keeps it (a 404 before the first)."""
    obj, chunks = store().read(owner_id(), file_id)
    response = Response(stream_with_context(chunks), mimetype="application/octet-stream")
    response.content_length = obj.bytes
    return response


@bp.delete("/v1/files/<file_id>")
def delete_file(file_id: str) -> Response:
    return json_response(store().delete(owner_id(), file_id))
