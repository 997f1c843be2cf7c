"""Cursor pages over an owner's resources, the OpenAI way (`after` an id, `limit`, `has_more`).

An owner's files and batches are zsets of ids scored by creation time (keys.py). A listed id
whose record has expired is dropped from its zset as the listing meets it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from flask import request
from pydantic import BaseModel
from redis import Redis

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def parse_query(model: type[M]) -> M:
    """The request's query string as a model (unknown parameters are a 400 naming them)."""
    return model.model_validate(request.args.to_dict())


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
