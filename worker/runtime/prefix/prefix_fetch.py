"""A prompt's prefix cache fetched from the worker that holds it, instead of prefilled again.

Placement (api/queue/placement.py) sends a job to the worker whose cache holds its prefix, but
not always: a holder with no free slot lets it go to a free worker, and a job's wait for its
holder runs out. The worker that takes it then asks the holder for the cache (`PrefixFetch`, in
the slot thread, before the job enters the engine), when this machine's figures say the transfer
is clearly faster than the prefill it saves (`FetchRule`). The holder's lending thread
(`Lender`, worker/runtime/prefix/prefix_lend.py) answers with the cache's file, in the disk tier's
format (worker/engine/prefix_disk.py), cut to what the prompt shares and written first where
need be (`PrefixCache.lend`). The taker keeps it in its own disk tier only if it is this model's
cache (its identity names the weights by content: worker/engine/prefix_identity.py) and, where
the fleet has a secret, its tag says a worker holding that secret sent it for this very ask
(worker/runtime/prefix/lend_tag.py); the engine restores it from there as it would any file,
checking its arrays again. A holder that answers late, with nothing or with junk, costs the job
only the wait: the prompt is prefilled as before. Both sides need a disk tier. An ask names the
job's cache scope (shared/queue/prefix/cache_scope.py), and the holder lends only what it holds
for that scope; a job whose request said `store: false` fetches nothing, since what is fetched is
kept on disk.

Wire (shared/queue/keys.py; its models in worker/runtime/prefix/prefix_lend.py): a lending thread
keeps `{ns}:lends:{worker}` set to the identity of its caches, so a taker asks only holders that
lend caches it can use (not a worker with no disk tier, lending off, an older version, or other
weights or KV form under the same name). An ask (`Ask`, JSON) goes on the holder's
`{ns}:prefix_asks:{worker}` list; the answer on `{ns}:prefix_reply:{ask id}`, in one
transaction: a header (`Header`: the file's length, 0: nothing to send; its tag), the file in
pieces of PIECE_BYTES, then an empty piece; the taker waits for the header, then reads the rest at
once. A file whose length differs from its header's is dropped, and so is one whose tag is
missing or wrong where this worker has a fleet secret (logged; that holder is set aside as a
silent one is). Redis holds one file in flight per fetch, for at most REPLY_TTL_S; the ask's
deadline is in Redis's clock, so machines' clocks need not agree, and a holder that finds it
passed sends nothing. Redis holds every key's data, so what a lender puts there is bounded
(`LendBounds`, MLXQ_PREFIX_FETCH_MAX_MB and _IN_FLIGHT_MB): a file over the cap, or one that
would take the bytes it sent within REPLY_TTL_S past theirs, is answered with nothing, and a
taker reads no header over the cap.

When it pays: the tokens the holder has beyond what this worker holds itself, times the prefill
time of a token (`prefill_s_per_token`, the figure placement waits by), must be at least MARGIN
times the expected transfer: the holder's tokens times the bytes a token takes in this model's
cache, over the link rate: what this worker's fetches measured, end to end, in the last
RECOVER_S, else `prefix_fetch_mb_s`. The wait is bounded by half the prefill saved (and
MAX_WAIT_S), so a fetch that fails costs at most that; a holder that gave no answer in time is
set aside for SET_ASIDE_S.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from redis import Redis
from rq.timeouts import JobTimeoutException

from shared.queue.keys import Keys
from shared.queue.liveness import live_workers
from shared.queue.prefix.prefix_blocks import BLOCK_TOKENS, HeldPrompt, block_hashes, matched_tokens
from shared.wire.ids import new_id
from worker.engine.prefix_cache import PrefixCache
from worker.engine.prefix_disk import DiskTier
from worker.engine.prefix_file import common_start
from worker.engine.prepare import PreparedJob
from worker.runtime.prefix.lend_tag import FleetKey
from worker.runtime.prefix.prefix_lend import DEFAULT_BOUNDS, Ask, Header, LendBounds

log = logging.getLogger(__name__)

ASKS_TTL_S = 30
# Fewer tokens than this saved is not worth a round trip to another worker.
MIN_GAIN_TOKENS = 4 * BLOCK_TOKENS
MARGIN = 2.0
# What an ask costs before the first byte moves: the lender's turn and two round trips.
ASK_S = 0.05
# How much a new measurement of the link moves the rate used, and how long it holds.
RATE_WEIGHT = 0.5
RECOVER_S = 300.0
# A holder that gave no answer in time is not asked again for this long.
SET_ASIDE_S = 60.0
# The longest single pop: a blocking read's client waits a little longer (worker/runtime/serve.py).
POP_S = 1.0
# The longest a slot waits on a holder: a draining worker waits for its slots too.
MAX_WAIT_S = 30.0


@dataclass
class FetchRule:
    """The module docstring's "when it pays", on this machine's figures."""

    prefill_s_per_token: float
    token_bytes: int  # of this model's cache (0: unknown, never fetch)
    link_bytes_per_s: float  # as configured: used until a fetch is measured, and RECOVER_S after
    bytes_per_s: float = 0.0  # as measured, end to end (0: not yet)
    measured_at: float = -RECOVER_S  # monotonic s

    def wait_s(self, gain: int, tokens: int) -> float | None:
        """How long to wait for a cache of `tokens` tokens that saves prefilling `gain` of them;
        None: the fetch does not pay."""
        if gain < MIN_GAIN_TOKENS or self.token_bytes <= 0:
            return None
        saved_s = gain * self.prefill_s_per_token
        expected_s = ASK_S + tokens * self.token_bytes / self.rate()
        return min(saved_s / MARGIN, MAX_WAIT_S) if expected_s * MARGIN <= saved_s else None

    def rate(self) -> float:
        """The link's bytes/s: as last measured, or as configured where none is recent (a link
        measured slow once is tried again, and a fast one measured again)."""
        recent = time.monotonic() - self.measured_at < RECOVER_S and self.bytes_per_s > 0
        return self.bytes_per_s if recent else self.link_bytes_per_s

    def measured(self, nbytes: int, seconds: float) -> None:
        rate = nbytes / max(seconds, 1e-3)
        before = self.rate()
        self.bytes_per_s = before + RATE_WEIGHT * (rate - before)
        self.measured_at = time.monotonic()


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
        bounds: LendBounds = DEFAULT_BOUNDS,
        fleet: FleetKey | None = None,
    ) -> None:
        """`redis`: a client for blocking reads; `cache`: this worker's, with its disk tier,
        which keeps what is fetched; `bounds`: a header over its file cap is read as
        nothing; `fleet`: the key a file's tag must verify under (None: files are untagged)."""
        assert cache.disk is not None
        self._redis = redis
        self._keys = keys
        self._model = model
        self._worker_id = worker_id
        self._heartbeat_s = heartbeat_s
        self._cache = cache
        self._disk: DiskTier = cache.disk
        self._rule = rule
        self._lock = threading.Lock()  # slot threads share the rule and the lenders read
        self._lenders: tuple[float, list[str]] = (0.0, [])
        self._aside: dict[str, float] = {}  # holder -> until when it is not asked (monotonic s)
        self._max_bytes = bounds.file_bytes
        self._fleet = fleet

    def __call__(self, prepared: PreparedJob) -> bool:
        """Fetch what another worker holds of the job's prompt, if it pays; whether it asked
        (and so waited: the caller checks the job was not cancelled meanwhile)."""
        prompt, scope = prepared.prompts[0], prepared.cache_scope
        if len(prompt) < MIN_GAIN_TOKENS or not prepared.keep_on_disk:  # most jobs: no round trip
            return False
        try:
            own = held_tokens(self._cache.held, HeldPrompt(scope, prompt))
            if len(prompt) - own < MIN_GAIN_TOKENS:  # held here already
                return False
            found, now = self._holder(HeldPrompt(scope, prompt))
            if found is None:
                return False
            with self._lock:
                wait_s = self._rule.wait_s(found.tokens - own, found.tokens)
            if wait_s is None:
                return False
        except JobTimeoutException:
            raise
        except Exception as err:  # a fetch only ever saves time: the job goes on without it
            log.warning("prefix fetch: failed (%s: %s)", type(err).__name__, err)
            return False
        self._fetch(found, HeldPrompt(scope, prompt), now + wait_s, wait_s)
        return True

    def _fetch(self, found: Holder, prompt: HeldPrompt, until: float, wait_s: float) -> None:
        started = time.perf_counter()
        try:
            data = self._ask(found.worker_id, prompt, until, wait_s)
            kept = self._disk.adopt(data, prompt.scope) if data else None
        except JobTimeoutException:
            raise
        except Exception as err:
            log.warning("prefix fetch: failed (%s: %s)", type(err).__name__, err)
            return
        seconds = time.perf_counter() - started
        if data is None:  # no answer in time: that holder is not asked for a while
            with self._lock:
                self._aside[found.worker_id] = time.monotonic() + SET_ASIDE_S
        if kept is None:
            log.info("prefix fetch: nothing usable from %s in %.2f s", found.worker_id, seconds)
            return
        assert data is not None
        with self._lock:
            self._rule.measured(len(data), seconds)
        megabytes = len(data) / 1e6
        log.info(
            "prefix fetch: %d tokens (%.1f MB) from %s in %.2f s",
            *(len(kept), megabytes, found.worker_id, seconds),
        )

    def _holder(self, prompt: HeldPrompt) -> tuple[Holder | None, float]:
        """The lender advertising most of `prompt`'s first blocks in its scope, and Redis's time
        (unix s)."""
        lenders = self._asked(self._lending())
        hashes = block_hashes(prompt.tokens, scope=prompt.scope)
        if not lenders or not hashes:
            return None, 0.0
        pipe = self._redis.pipeline(transaction=False)
        pipe.time()
        for worker in lenders:
            pipe.smismember(self._keys.prefix_blocks(worker), hashes)
        (seconds, micros), *rows = pipe.execute()
        held = [matched_tokens(row) for row in rows]
        best = max(range(len(lenders)), key=lambda i: held[i])
        found = Holder(lenders[best], held[best]) if held[best] else None
        return found, seconds + micros / 1e6

    def _lending(self) -> list[str]:
        """The other live workers that lend caches of this worker's identity, read at most
        once a heartbeat."""
        with self._lock:
            read_at, lenders = self._lenders
        if time.monotonic() - read_at < self._heartbeat_s:
            return lenders
        live = live_workers(self._redis, self._keys, [self._model], self._heartbeat_s)
        others = sorted(live.get(self._model, set()) - {self._worker_id})
        identities = self._redis.mget([self._keys.lends(w) for w in others]) if others else []
        mine = self._disk.identity.encode()
        lenders = [w for w, i in zip(others, identities, strict=True) if i == mine]
        with self._lock:
            self._lenders = (time.monotonic(), lenders)
        return lenders

    def _asked(self, lenders: list[str]) -> list[str]:
        """`lenders` less those set aside."""
        now = time.monotonic()
        with self._lock:
            return [w for w in lenders if self._aside.get(w, 0.0) < now]

    def _ask(self, holder: str, prompt: HeldPrompt, until: float, wait_s: float) -> bytes | None:
        """The holder's file; b"" if it sent nothing usable, None if no answer came in time."""
        ask = Ask(
            reply=new_id("ask_"),
            identity=self._disk.identity,
            scope=prompt.scope,
            tokens=prompt.tokens,
            until=until,
        )
        asks = self._keys.prefix_asks(holder)
        pipe = self._redis.pipeline(transaction=False)
        pipe.rpush(asks, ask.model_dump_json())
        pipe.expire(asks, ASKS_TTL_S)
        pipe.execute()
        answer = self._answer(ask, time.monotonic() + wait_s)
        if answer is None:
            return None
        header, data = answer
        return data if self._authentic(holder, ask, header, data) else b""

    def _answer(self, ask: Ask, deadline: float) -> tuple[Header, bytes] | None:
        """The answer to `ask`: its header and a file as long as the header says (b"": none
        usable); None if no header came by `deadline` (monotonic s)."""
        reply = self._keys.prefix_reply(ask.reply)
        try:
            raw = self._pop(reply, deadline)
            if raw is None:
                return None
            header = Header.model_validate_json(raw)
            if header.bytes > self._max_bytes:
                return header, b""
            # The rest came in the header's transaction: all of it is there already.
            pipe = self._redis.pipeline(transaction=True)
            pipe.lrange(reply, 0, -1)
            pipe.delete(reply)
            rest: list[bytes] = pipe.execute()[0]
        finally:
            self._redis.delete(reply)
        if not rest or rest[-1] != b"":
            return header, b""
        data = b"".join(rest[:-1])
        return header, data if len(data) == header.bytes else b""

    def _authentic(self, holder: str, ask: Ask, header: Header, data: bytes) -> bool:
        """Whether `data` may be kept: no fleet secret here, or its tag verifies. A refusal is
        logged (without the prompt) and sets the holder aside: its secret is not this one's."""
        if self._fleet is None or not data or self._fleet.verifies(ask, data, header.tag):
            return True
        why = "no tag" if header.tag is None else "a wrong tag"
        log.warning(
            "prefix fetch: refused a cache from %s: %s (not sent under this MLXQ_FLEET_SECRET)",
            holder,
            why,
        )
        with self._lock:
            self._aside[holder] = time.monotonic() + SET_ASIDE_S
        return False

    def _pop(self, key: str, deadline: float) -> bytes | None:
        """The next piece of `key`, or None once `deadline` (monotonic s) has passed."""
        while (left := deadline - time.monotonic()) > 0:
            # Never 0 (for Redis, wait forever) nor under 1 ms (Redis before 7.0.8 read 0).
            got = self._redis.blpop([key], timeout=max(min(left, POP_S), 0.01))
            if got is not None and isinstance(got[1], bytes):
                return got[1]
        return None


def held_tokens(held: Sequence[HeldPrompt], prompt: HeldPrompt) -> int:
    """How many of `prompt`'s first tokens the longest match of its scope among `held` holds."""
    wanted = np.asarray(prompt.tokens, dtype=np.uint32)
    # Sequences starting otherwise, or of another scope, cost no conversion.
    first, scope = prompt.tokens[:1], prompt.scope
    starts = (h.tokens for h in held if h.tokens[:1] == first and h.scope == scope)
    return max((common_start(np.asarray(t, dtype=np.uint32), wanted) for t in starts), default=0)
