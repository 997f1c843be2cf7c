"""A prompt's prefix cache fetched from the worker that holds it, instead of prefilled again.

Placement (api/queue/placement.py) sends a job to the worker whose cache holds its prefix, but
not always: a holder with no free slot lets it go to a free worker, and a job's wait for its
holder runs out. The worker that takes it then asks the holder for the cache (`PrefixFetch`, in
the slot thread, before the job enters the engine), when this machine's figures say the transfer
is clearly faster than the prefill it saves (`FetchRule`). The holder's lending thread (`Lender`)
answers with the cache's file, in the disk tier's format (worker/engine/prefix_disk.py),
written first if memory alone held it. The taker keeps it in its own disk tier only if it is this
model's cache (its identity names the weights by content: worker/engine/prefix_identity.py),
and the engine restores it from there as it would any file, checking its arrays again.
A holder that answers late, with nothing or with junk, costs the job only the wait: the prompt
is prefilled as before. Both sides need a disk tier.

Wire (shared/queue/keys.py): an ask (`Ask`, JSON) on the holder's `{ns}:prefix_asks:{worker}`
list; the answer on `{ns}:prefix_reply:{ask id}`: the file in pieces of PIECE_BYTES, then an
empty piece (an empty answer: nothing held). Redis holds one file in flight per fetch, for at
most REPLY_TTL_S.

When it pays: the tokens the holder has beyond what this worker holds itself, times the prefill
time of a token (`prefill_s_per_token`, the figure placement waits by), must be at least MARGIN
times the expected transfer: the holder's tokens times the bytes a token takes in this model's
cache, over the link rate, first `prefix_fetch_mb_s`, then what this worker's fetches measured.
The wait is bounded by half the prefill saved, so a fetch that fails costs at most that.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

import numpy as np
from pydantic import BaseModel, Field, ValidationError
from redis import Redis
from redis.exceptions import RedisError

from shared.queue.keys import Keys
from shared.queue.liveness import live_workers
from shared.queue.prefix_blocks import BLOCK_TOKENS, block_hashes, matched_blocks
from shared.wire.ids import ID_PATTERN, new_id
from worker.engine.prefix_cache import PrefixCache
from worker.engine.prefix_disk import DiskTier
from worker.engine.prepare import PreparedJob

log = logging.getLogger(__name__)

PIECE_BYTES = 4 << 20
REPLY_TTL_S = 30
ASKS_TTL_S = 30
# Fewer tokens than this saved is not worth a round trip to another worker.
MIN_GAIN_TOKENS = 4 * BLOCK_TOKENS
MARGIN = 2.0
# What an ask costs before the first byte moves: the lender's turn and two round trips.
ASK_S = 0.05
# How much a new measurement of the link moves the rate used.
RATE_WEIGHT = 0.5
MAX_ASK_TOKENS = 1 << 20


class Ask(BaseModel):
    """An ask for the cache holding most of `tokens`' first tokens, answered by `until`."""

    reply: Annotated[str, Field(pattern=ID_PATTERN)]
    tokens: Annotated[list[int], Field(max_length=MAX_ASK_TOKENS)]
    until: float  # unix s


@dataclass
class FetchRule:
    """The module docstring's "when it pays", on this machine's figures."""

    prefill_s_per_token: float
    token_bytes: int  # of this model's cache (0: unknown, never fetch)
    bytes_per_s: float  # the link, as last measured

    def wait_s(self, gain: int, tokens: int) -> float | None:
        """How long to wait for a cache of `tokens` tokens that saves prefilling `gain` of them;
        None: the fetch does not pay."""
        if gain < MIN_GAIN_TOKENS or self.token_bytes <= 0:
            return None
        saved_s = gain * self.prefill_s_per_token
        expected_s = ASK_S + tokens * self.token_bytes / self.bytes_per_s
        return saved_s / MARGIN if expected_s * MARGIN <= saved_s else None

    def measured(self, nbytes: int, seconds: float) -> None:
        rate = nbytes / max(seconds, 1e-3)
        self.bytes_per_s += RATE_WEIGHT * (rate - self.bytes_per_s)


@dataclass(frozen=True)
class Holder:
    worker_id: str
    tokens: int  # of the prompt's first tokens its cache holds, by its advertised blocks


class PrefixFetch:
    """Run by a slot thread on each prepared job, before it enters the engine."""

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        model: str,
        worker_id: str,
        heartbeat_s: float,
        cache: PrefixCache,
        rule: FetchRule,
    ) -> None:
        """`cache`: this worker's, with its disk tier, which keeps what is fetched."""
        assert cache.disk is not None
        self._redis = redis
        self._keys = keys
        self._model = model
        self._worker_id = worker_id
        self._heartbeat_s = heartbeat_s
        self._cache = cache
        self._disk: DiskTier = cache.disk
        self._rule = rule
        self._rule_lock = threading.Lock()  # slot threads share the measured rate

    def __call__(self, prepared: PreparedJob) -> None:
        prompt = prepared.prompts[0]
        if len(prompt) < MIN_GAIN_TOKENS:  # most jobs: no round trip, nothing computed
            return
        try:
            self._fetch(prompt)
        except RedisError as err:  # a fetch only ever saves time: the job goes on without it
            log.warning("prefix fetch: Redis failed: %s", err)

    def _fetch(self, prompt: list[int]) -> None:
        found = self._holder(prompt)
        if found is None:
            return
        own = held_tokens(self._cache.held, prompt)
        with self._rule_lock:
            wait_s = self._rule.wait_s(found.tokens - own, found.tokens)
        if wait_s is None:
            return
        started = time.perf_counter()
        data = self._ask(found.worker_id, prompt, wait_s)
        seconds = time.perf_counter() - started
        kept = self._disk.adopt(data) if data else None
        if kept is None:
            log.info("prefix fetch: nothing usable from %s in %.2f s", found.worker_id, seconds)
            return
        with self._rule_lock:
            self._rule.measured(len(data), seconds)
        log.info(
            "prefix fetch: %d tokens (%.1f MB) from %s in %.2f s",
            len(kept),
            len(data) / 1e6,
            found.worker_id,
            seconds,
        )

    def _holder(self, prompt: list[int]) -> Holder | None:
        """The other live worker advertising most of `prompt`'s first blocks."""
        live = live_workers(self._redis, self._keys, [self._model], self._heartbeat_s)
        others = sorted(live.get(self._model, set()) - {self._worker_id})
        hashes = block_hashes(prompt)
        if not others or not hashes:
            return None
        pipe = self._redis.pipeline(transaction=False)
        for worker in others:
            pipe.smismember(self._keys.prefix_blocks(worker), hashes)
        rows = pipe.execute()
        held = [matched_blocks([bool(m) for m in row]) * BLOCK_TOKENS for row in rows]
        best = max(range(len(others)), key=lambda i: held[i])
        return Holder(others[best], held[best]) if held[best] else None

    def _ask(self, holder: str, prompt: list[int], wait_s: float) -> bytes:
        """The holder's answer, or b"" when it gave none within `wait_s`."""
        ask = Ask(reply=new_id("ask_"), tokens=prompt, until=time.time() + wait_s)
        reply = self._keys.prefix_reply(ask.reply)
        asks = self._keys.prefix_asks(holder)
        pipe = self._redis.pipeline(transaction=False)
        pipe.rpush(asks, ask.model_dump_json())
        pipe.expire(asks, ASKS_TTL_S)
        pipe.execute()
        pieces: list[bytes] = []
        deadline = time.monotonic() + wait_s
        try:
            while (left := deadline - time.monotonic()) > 0:
                got = self._redis.blpop([reply], timeout=min(left, 1.0))
                if got is None:
                    continue
                piece = got[1]
                if not isinstance(piece, bytes) or not piece:
                    return b"".join(pieces)
                pieces.append(piece)
            return b""
        finally:
            self._redis.delete(reply)


def held_tokens(held: Sequence[list[int]], prompt: list[int]) -> int:
    """How many of `prompt`'s first tokens the longest match among `held` holds."""
    wanted = np.asarray(prompt, dtype=np.int64)
    best = 0
    for tokens in held:
        n = min(len(tokens), len(wanted))
        if n <= best or tokens[:1] != prompt[:1]:
            continue
        same = np.asarray(tokens[:n], dtype=np.int64) == wanted[:n]
        best = max(best, n if bool(same.all()) else int(np.argmin(same)))
    return best


class Lender:
    """The thread that answers other workers' asks for what this worker's cache holds."""

    def __init__(self, redis: Redis, keys: Keys, worker_id: str, cache: PrefixCache) -> None:
        """`redis`: a client for blocking reads (its socket waits out the pops)."""
        self._redis = redis
        self._asks = keys.prefix_asks(worker_id)
        self._keys = keys
        self._cache = cache

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self._run, args=(stop,), name="prefix-lend", daemon=True)
        thread.start()
        return thread

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                got = self._redis.blpop([self._asks], timeout=1)
                if got is not None and isinstance(got[1], bytes):
                    self.answer(got[1])
            except RedisError as err:
                log.warning("prefix lending: Redis failed: %s", err)
                stop.wait(1.0)
            except Exception:  # a bad ask or file must not end the thread
                log.exception("prefix lending: could not answer an ask")

    def answer(self, raw: bytes) -> None:
        try:
            ask = Ask.model_validate_json(raw)
        except ValidationError as err:
            log.warning("prefix lending: a malformed ask: %s", err.errors()[:1])
            return
        if time.time() > ask.until:
            return  # its asker stopped waiting
        path = self._cache.lend(ask.tokens)
        try:
            data = memoryview(path.read_bytes()) if path is not None else memoryview(b"")
        except OSError:  # removed by the cap meanwhile
            data = memoryview(b"")
        reply = self._keys.prefix_reply(ask.reply)
        pipe = self._redis.pipeline(transaction=False)
        for start in range(0, len(data), PIECE_BYTES):
            pipe.rpush(reply, data[start : start + PIECE_BYTES])
        pipe.rpush(reply, b"")
        pipe.expire(reply, REPLY_TTL_S)
        pipe.execute()
