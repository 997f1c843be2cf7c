"""Cursor pages over an owner's resources, the OpenAI way (`after` an id, `limit`, `has_more`).

An owner's files and batches are zsets of ids scored by creation time (keys.py). A listed id
whose record has expired is dropped from its zset as the listing meets it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar, get_args, get_origin

from flask import request
from pydantic import BaseModel
from redis import Redis

from shared.wire.digits import parse_integer
from shared.wire.errors import InvalidRequestError

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def parse_query(model: type[M]) -> M:
    """The request's query string as a model (unknown parameters are a 400 naming them).

    An integer parameter must be written as one, in ASCII digits (shared/wire/digits.py):
    pydantic would read `0.0` or `+3` as 0 and 3."""
    args = request.args.to_dict()
    for name, value in args.items():
        field = model.model_fields.get(name)
        wants_int = field is not None and _wants_int(field.annotation)
        if wants_int and parse_integer(value, signed=True) is None:
            raise InvalidRequestError(
                f"`{name}` must be an integer, not {value[:32]!r}", param=name, code="invalid_type"
            )
    return model.model_validate(args)


def _wants_int(annotation: Any) -> bool:
    """Whether a field's type is an int, maybe Annotated or optional."""
    if get_origin(annotation) is Annotated:
        return _wants_int(get_args(annotation)[0])
    return annotation is int or any(_wants_int(a) for a in get_args(annotation))


def page(
    redis: Redis,
    index: str,
    after: str | None,
    limit: int,
    load: Callable[[list[str]], list[T | None]],
    newest_first: bool = True,
    keep: Callable[[T], bool] = lambda record: True,
) -> tuple[list[T], bool]:
    """Up to `limit` loaded records after the id `after` (those `keep` accepts), and whether
    more follow. `load` answers None for an id whose record is gone."""
    start = 0
    if after is not None:
        rank: Any = redis.zrevrank(index, after) if newest_first else redis.zrank(index, after)
        if rank is None:
            return [], False
        start = int(rank) + 1
    found: list[T] = []
    while len(found) <= limit:
        span = limit + 1 - len(found)
        rows: list[Any] = (
            redis.zrevrange(index, start, start + span - 1)
            if newest_first
            else redis.zrange(index, start, start + span - 1)
        )
        if not rows:
            break
        ids = [bytes(r).decode() for r in rows]
        records = load(ids)
        gone = [i for i, record in zip(ids, records, strict=True) if record is None]
        if gone:
            redis.zrem(index, *gone)
        found.extend(r for r in records if r is not None and keep(r))
        start += len(ids) - len(gone)
    return found[:limit], len(found) > limit
