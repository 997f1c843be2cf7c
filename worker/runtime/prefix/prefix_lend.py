"""The lending side of the prefix fetch (worker/runtime/prefix/prefix_fetch.py): the thread that
answers other workers' asks for what this worker's prefix cache holds, and the wire both sides
share.

An ask (`Ask`, JSON) comes on this worker's `{ns}:prefix_asks:{worker}` list; the answer goes on
`{ns}:prefix_reply:{ask id}`, in one transaction: a header (`Header`: the file's length, 0:
nothing to send; and with a fleet secret, the file's tag: worker/runtime/prefix/lend_tag.py), the
file in pieces of PIECE_BYTES, then an empty piece. The lender keeps `{ns}:lends:{worker}` set to
the identity of its caches while it runs, and lends only what its cache holds for the ask's scope
(`PrefixCache.lend`). What it puts into Redis is bounded
(`LendBounds`): a file over the cap, or one that would take the bytes sent within REPLY_TTL_S
past theirs, is answered with nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, Field, ValidationError
from redis import Redis
from redis.exceptions import RedisError

from shared.queue.keys import Keys
from shared.queue.prefix.cache_scope import SCOPE_PATTERN
from shared.wire.ids import ID_PATTERN
from worker.engine.prefix_cache import PrefixCache
from worker.runtime.prefix.lend_tag import FleetKey

log = logging.getLogger(__name__)

PIECE_BYTES = 4 << 20
REPLY_TTL_S = 30
LENDS_TTL_S = 5  # the lending thread renews it every turn (at most 1 s)
MAX_ASK_TOKENS = 1 << 20


class Ask(BaseModel):
    """An ask for the cache of `scope` holding most of `tokens`' first tokens, answered by
    `until`."""

    reply: Annotated[str, Field(pattern=ID_PATTERN)]
    identity: str  # the asker's caches' (worker/engine/prefix_identity.py)
    scope: Annotated[str, Field(pattern=SCOPE_PATTERN)]
    tokens: Annotated[list[int], Field(max_length=MAX_ASK_TOKENS)]
    until: float  # unix s, Redis's clock


class Header(BaseModel):
    """The first piece of an answer."""

    bytes: int  # the file's length; 0: nothing to send
    # The file's tag under the fleet secret, bound to the ask (lend_tag.py); None: no secret
    # here, or nothing sent.
    tag: str | None = None


@dataclass(frozen=True)
class LendBounds:
    """The most bytes of one lent file, and of the files sent within REPLY_TTL_S."""

    file_bytes: int = 512 << 20
    in_flight_bytes: int = 1 << 30


DEFAULT_BOUNDS = LendBounds()


class Lender:
    """The thread that answers other workers' asks for what this worker's cache holds."""

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        worker_id: str,
        cache: PrefixCache,
        bounds: LendBounds = DEFAULT_BOUNDS,
        fleet: FleetKey | None = None,
    ) -> None:
        """`redis`: a client for blocking reads (its socket waits out the pops); `cache`:
        this worker's, with its disk tier; `bounds`: what it may put into Redis; `fleet`: the
        key each lent file is tagged with (None: sent untagged)."""
        assert cache.disk is not None
        self._redis = redis
        self._asks = keys.prefix_asks(worker_id)
        self._lends = keys.lends(worker_id)
        self._identity = cache.disk.identity
        self._keys = keys
        self._cache = cache
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self.bounds = bounds
        self._fleet = fleet
        self._sent: deque[tuple[float, int]] = deque()  # (monotonic s, bytes) of recent answers

    def start(self, stop: threading.Event) -> None:
        """Lend until `stop` (or `close`)."""
        self._thread = threading.Thread(
            target=self._run, args=(stop,), name="prefix-lend", daemon=True
        )
        self._thread.start()

    def close(self, timeout_s: float) -> None:
        """Stop lending, and wait up to `timeout_s` for a lend in progress to end."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set() and not self._closing.is_set():
            try:
                self._redis.set(self._lends, self._identity, ex=LENDS_TTL_S)
                got = self._redis.blpop([self._asks], timeout=1)
                if got is not None and isinstance(got[1], bytes):
                    self.answer(got[1])
            except RedisError as err:
                log.warning("prefix lending: Redis failed: %s", err)
                stop.wait(1.0)
            except Exception:  # a bad ask or file must not end the thread
                log.exception("prefix lending: could not answer an ask")
        with contextlib.suppress(RedisError):
            self._redis.delete(self._lends)

    def answer(self, raw: bytes) -> None:
        try:
            ask = Ask.model_validate_json(raw)
        except ValidationError as err:
            log.warning("prefix lending: a malformed ask: %s", err.errors()[:1])
            return
        if self._late(ask):
            return  # its asker stopped waiting
        data = memoryview(b"")  # nothing to send: said at once, so the asker does not wait
        if ask.identity == self._identity:
            try:
                path = self._cache.lend(ask.tokens, ask.scope)
                if path is not None and self._room(path.stat().st_size):
                    data = memoryview(path.read_bytes())
            except Exception:  # a file removed by the cap meanwhile, a failed write
                log.exception("prefix lending: could not lend a cache")
        header = self._header(ask, data)
        if self._late(ask):  # the lend took too long: sending now only fills Redis
            return
        reply = self._keys.prefix_reply(ask.reply)
        pipe = self._redis.pipeline(transaction=True)
        pipe.rpush(reply, header.model_dump_json())
        pipe.expire(reply, REPLY_TTL_S)
        for start in range(0, len(data), PIECE_BYTES):
            pipe.rpush(reply, data[start : start + PIECE_BYTES])
        pipe.rpush(reply, b"")
        pipe.execute()

    def _header(self, ask: Ask, data: memoryview) -> Header:
        """The answer's header: its length, and its tag where there is a file and a secret
        (a second read of the file, on this thread: the engine steps on its own)."""
        tag = self._fleet.tag(ask, data) if self._fleet is not None and data else None
        return Header(bytes=len(data), tag=tag)

    def _room(self, nbytes: int) -> bool:
        """Whether a file of `nbytes` may go into Redis now (`LendBounds`); if so, it is
        counted as sent."""
        now = time.monotonic()
        while self._sent and now - self._sent[0][0] > REPLY_TTL_S:
            self._sent.popleft()
        in_flight = sum(n for _, n in self._sent)
        if nbytes > self.bounds.file_bytes or in_flight + nbytes > self.bounds.in_flight_bytes:
            log.info("prefix lending: not sending %d MB: over MLXQ_PREFIX_FETCH_*_MB", nbytes >> 20)
            return False
        self._sent.append((now, nbytes))
        return True

    def _late(self, ask: Ask) -> bool:
        seconds, micros = self._redis.time()
        return seconds + micros / 1e6 > ask.until
