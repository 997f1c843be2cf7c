"""Request bodies into pydantic models; every failure becomes a 4xx in api/http/errors.py.

A body is accepted only as one JSON document declared as such:
- Content-Type `application/json` (or `+json`), UTF-8 if a charset is given; else 415.
- Parsed by pydantic-core's parser, which refuses NaN and Infinity here, lone surrogates and
  invalid UTF-8, and nesting past its recursion limit (a clean error, never a RecursionError).
- Every number finite (1e400 would otherwise read as infinity) and no string, key or value,
  with a NUL character: a tokenizer or a C library downstream must never see one.
Only then does the model validate it (limits, types, unsupported parameters). The body's size
is bounded before any of this by Flask's MAX_CONTENT_LENGTH (413), chunked bodies included.
A request's images are checked after it validates (`checked_images`: shared/wire/images.py's
rule, under the settings' limits), before anything of it is queued. Parsing, validating (a JSON
schema's grammar is compiled as the model validates) and the image check run off the hub
(api/http/off_hub.py): a megabyte body takes a tenth of a second to parse and validate, and
decoding an image of the largest size most of a second (measured: 0.7 s for 33 megapixels).
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import pydantic_core
from flask import request
from pydantic import BaseModel
from werkzeug.exceptions import RequestEntityTooLarge

from api.backend import backend
from api.http.off_hub import off_hub
from shared.queue.config import Settings
from shared.wire.errors import InvalidJSONError, InvalidRequestError, UnsupportedMediaTypeError
from shared.wire.images import ImageInput, ImageLimits, ImageRef, check_images

M = TypeVar("M", bound=BaseModel)


def parse_body(model: type[M]) -> M:
    return off_hub(parse_json, model, json_body())


def json_body() -> bytes:
    """The request's body, declared JSON, not empty and within its size, not yet parsed (a
    message batch's is parsed by its intake process: api/stores/batch_feed.py)."""
    body = request.get_data(cache=False)
    limit = request.max_content_length
    if request.content_length is None and limit is not None and len(body) >= limit:
        # A chunked body is cut at the limit, not refused, by Werkzeug: refuse it here.
        raise RequestEntityTooLarge()
    if not body.strip():
        raise InvalidRequestError("The request body is empty; send a JSON object.")
    _require_json_content_type()
    return body


def parse_json(model: type[M], body: bytes) -> M:
    """A JSON body into `model`, with every check of the module docstring but the request's."""
    try:
        data = pydantic_core.from_json(body, allow_inf_nan=False)
    except ValueError as err:
        raise InvalidJSONError(
            f"We could not parse the JSON body of your request ({err}). Send one JSON object; "
            "NaN and Infinity are not JSON."
        ) from err
    check_values(data)
    return model.model_validate(data, strict=True)


def image_limits(settings: Settings) -> ImageLimits:
    return ImageLimits(
        max_bytes=settings.image_max_bytes,
        max_images=settings.image_max_per_request,
        max_pixels=settings.image_max_pixels,
        urls=settings.image_urls,
    )


def checked_images(images: list[ImageInput]) -> list[ImageRef]:
    """A validated request's images, checked and identified; the first bad one is a 400
    naming its part. Off the hub where there is one (the module docstring)."""
    if not images:
        return []
    return off_hub(check_images, images, image_limits(backend().settings))


def _require_json_content_type() -> None:
    mimetype = request.mimetype
    charset = request.mimetype_params.get("charset", "utf-8").lower()
    if (mimetype == "application/json" or mimetype.endswith("+json")) and charset in (
        "utf-8",
        "utf8",
    ):
        return
    raise UnsupportedMediaTypeError(
        f"Unsupported Content-Type {request.content_type or '(none)'!r}: send the body as JSON "
        "with the header 'Content-Type: application/json'."
    )


def _refuse(path: tuple[str | int, ...], why: str) -> None:
    param = ".".join(str(part) for part in path) or None
    where = f"Invalid value for '{param}'" if param else "Invalid request body"
    raise InvalidRequestError(f"{where}: {why}.", param=param, code="invalid_value")


def check_values(data: Any) -> None:
    """Refuse non-finite numbers and NUL characters anywhere in a parsed JSON document."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                _refuse(path, "text must not contain NUL (\\u0000) characters")
        elif isinstance(value, float):
            if not math.isfinite(value):
                _refuse(path, "numbers must be finite and within the range of a double")
        elif isinstance(value, dict):
            for key, item in value.items():
                if "\x00" in key:
                    _refuse(path, "keys must not contain NUL (\\u0000) characters")
                stack.append(((*path, key), item))
        elif isinstance(value, list):
            stack.extend(((*path, i), item) for i, item in enumerate(value))
