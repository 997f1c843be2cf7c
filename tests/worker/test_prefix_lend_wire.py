"""The lend of a prefix cache over the session's Redis, without worker processes: a lending thread
and a taker, as two workers run them, on two caches of a tiny llama in two folders (two
machines). The file itself, and the rule that decides whether a fetch pays:
tests/worker/test_prefix_lending.py; across real worker processes:
tests/e2e/test_prefix_fetch.py."""

from __future__ import annotations

import logging
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

from shared.queue.keys import Keys
from shared.queue.prefix.cache_scope import UNSCOPED
from shared.queue.prefix.prefix_blocks import block_hashes
from tests.worker.test_prefix_lending import _cache, _finished
from worker.engine.prefix_cache import PrefixCache
from worker.engine.prepare import PreparedJob
from worker.ops.cluster import wait_until
from worker.runtime.prefix.lend_tag import FleetKey
from worker.runtime.prefix.prefix_fetch import MIN_GAIN_TOKENS, FetchRule, PrefixFetch
from worker.runtime.prefix.prefix_lend import DEFAULT_BOUNDS, Ask, Header, LendBounds, Lender

LONG = [(i % 97) + 1 for i in range(320)]  # a held history past MIN_GAIN_TOKENS
ASKED = [*LONG, 50, 51]
MODEL = "tiny"


@dataclass
class Wire:
    redis: Redis
    keys: Keys
    holder: PrefixCache
    taker: PrefixCache
    stop: threading.Event


@pytest.fixture
def wire(model: Any, tmp_path: Path, redis_url: str) -> Iterator[Wire]:
    """A holder of LONG (registered live, its blocks advertised) and an empty taker, under a
    namespace of their own."""
    redis = Redis.from_url(redis_url)
    keys = Keys(f"lend{secrets.token_hex(4)}")
    holder, taker = _cache(tmp_path / "holder", model), _cache(tmp_path / "taker", model)
    holder.store(LONG, _finished(model, LONG), UNSCOPED)
    redis.zadd(keys.workers(MODEL), {"holder": time.time() + 600})
    redis.sadd(keys.prefix_blocks("holder"), *block_hashes(LONG))
    presence = redis.pubsub()
    presence.subscribe(keys.presence("holder"))
    stop = threading.Event()
    try:
        yield Wire(redis, keys, holder, taker, stop)
    finally:
        stop.set()
        presence.close()
        found = list(redis.scan_iter(f"{keys.ns}:*"))
        if found:
            redis.delete(*found)


def _taker(
    wire: Wire, prefill_s_per_token: float = 1.0, fleet: FleetKey | None = None
) -> PrefixFetch:
    assert wire.taker.disk is not None
    rule = FetchRule(prefill_s_per_token, token_bytes=1000, link_bytes_per_s=1e9)
    args = (wire.redis, wire.keys, MODEL, "taker", 60.0, wire.taker, rule)
    return PrefixFetch(*args, DEFAULT_BOUNDS, fleet)


def _job(prompt: list[int]) -> PreparedJob:
    return PreparedJob("job", (prompt,), max_tokens=1, choices=(), stops=())


def _lend(wire: Wire, fleet: FleetKey | None = None) -> Lender:
    lender = Lender(wire.redis, wire.keys, "holder", wire.holder, DEFAULT_BOUNDS, fleet)
    lender.start(wire.stop)
    wait_until(lambda: wire.redis.exists(wire.keys.lends("holder")), 10, "the lender")
    return lender


def test_a_taker_fetches_what_a_live_lender_holds_and_leaves_nothing_in_redis(
    wire: Wire,
) -> None:
    _lend(wire)
    assert _taker(wire)(_job(ASKED)) is True
    assert wire.taker.reuse(ASKED, shared=0, scope=UNSCOPED).hits == len(LONG)
    assert not list(wire.redis.scan_iter(f"{wire.keys.ns}:prefix_reply:*"))


def test_prompts_too_short_to_pay_ask_nobody(wire: Wire) -> None:
    _lend(wire)
    assert _taker(wire)(_job(ASKED[: MIN_GAIN_TOKENS - 1])) is False


def test_a_worker_that_does_not_lend_is_never_asked(wire: Wire) -> None:
    assert _taker(wire)(_job(ASKED)) is False  # it holds the blocks, but lends nothing
    assert not wire.redis.exists(wire.keys.prefix_asks("holder"))


def test_a_lender_of_other_caches_is_never_asked(wire: Wire) -> None:
    wire.redis.set(wire.keys.lends("holder"), "another-model")
    assert _taker(wire)(_job(ASKED)) is False
    assert not wire.redis.exists(wire.keys.prefix_asks("holder"))


def test_a_silent_lender_costs_one_job_half_the_prefill_then_is_set_aside(wire: Wire) -> None:
    assert wire.holder.disk is not None
    wire.redis.set(wire.keys.lends("holder"), wire.holder.disk.identity)  # but never answers
    taker = _taker(wire, prefill_s_per_token=0.002)  # 320 tokens: a 0.32 s wait
    started = time.perf_counter()
    assert taker(_job(ASKED)) is True
    assert 0.3 <= time.perf_counter() - started < 2.0
    assert wire.taker.reuse(ASKED, shared=0, scope=UNSCOPED).hits == 0
    assert taker(_job(ASKED)) is False  # not asked again for a while
    assert taker._rule.rate() == 1e9  # the link was not what failed


def _ask(reply: str, identity: str, until: float) -> Ask:
    """An ask for ASKED, unscoped."""
    return Ask(reply=reply, identity=identity, scope=UNSCOPED, tokens=ASKED, until=until)


def test_an_ask_for_another_models_cache_is_answered_with_nothing_at_once(wire: Wire) -> None:
    lender = Lender(wire.redis, wire.keys, "holder", wire.holder)
    until = time.time() + 60  # the test's Redis runs on this machine's clock
    ask = _ask("ask_other", "another-model", until)
    lender.answer(ask.model_dump_json().encode())
    reply = wire.redis.lrange(wire.keys.prefix_reply("ask_other"), 0, -1)
    assert reply == [Header(bytes=0).model_dump_json().encode(), b""]


def test_a_lend_whose_file_cannot_be_written_is_answered_with_nothing(wire: Wire) -> None:
    assert wire.holder.disk is not None
    shutil.rmtree(wire.holder.disk.folder)  # its folder gone under it
    lender = Lender(wire.redis, wire.keys, "holder", wire.holder)
    ask = _ask("ask_gone", wire.holder.disk.identity, 1e12)
    lender.answer(ask.model_dump_json().encode())
    reply = wire.redis.lrange(wire.keys.prefix_reply("ask_gone"), 0, -1)
    assert reply == [Header(bytes=0).model_dump_json().encode(), b""]


def _answer_once(wire: Wire, pieces: Callable[[Ask, bytes], list[str | bytes]]) -> None:
    """Answer the holder's next ask, in a thread, with `pieces(ask, file)`: the file the holder
    would lend for ASKED, put on the wire by something other than its lending thread."""
    assert wire.holder.disk is not None
    wire.redis.set(wire.keys.lends("holder"), wire.holder.disk.identity)
    path = wire.holder.lend(ASKED, UNSCOPED)
    assert path is not None
    data = path.read_bytes()

    def answer() -> None:
        got = wire.redis.blpop([wire.keys.prefix_asks("holder")], timeout=10)
        assert got is not None
        ask = Ask.model_validate_json(got[1])
        wire.redis.rpush(wire.keys.prefix_reply(ask.reply), *pieces(ask, data))

    threading.Thread(target=answer, daemon=True).start()


def test_an_answer_whose_length_is_not_its_headers_is_dropped(wire: Wire) -> None:
    """As a piece lost or sent twice would leave it: the file is whole, the header says not."""
    _answer_once(wire, lambda _, data: [Header(bytes=len(data) + 1).model_dump_json(), data, b""])
    assert _taker(wire)(_job(ASKED)) is True
    assert wire.taker.reuse(ASKED, shared=0, scope=UNSCOPED).hits == 0


@pytest.mark.parametrize("raw", [b"", b"junk", b'{"reply": "../x", "identity": "a"}'])
def test_a_malformed_ask_is_dropped_and_the_lender_goes_on(wire: Wire, raw: bytes) -> None:
    _lend(wire)
    wire.redis.rpush(wire.keys.prefix_asks("holder"), raw)
    assert _taker(wire)(_job(ASKED)) is True
    assert wire.taker.reuse(ASKED, shared=0, scope=UNSCOPED).hits == len(LONG)


def test_an_ask_past_its_deadline_gets_no_answer(wire: Wire) -> None:
    assert wire.holder.disk is not None
    lender = Lender(wire.redis, wire.keys, "holder", wire.holder)
    ask = _ask("ask_late", wire.holder.disk.identity, 1.0)
    lender.answer(ask.model_dump_json().encode())
    assert not wire.redis.exists(wire.keys.prefix_reply("ask_late"))


def test_a_lender_puts_no_file_over_its_cap_into_redis(wire: Wire) -> None:
    assert wire.holder.disk is not None
    lender = Lender(wire.redis, wire.keys, "holder", wire.holder, LendBounds(file_bytes=1000))
    lender.answer(_ask("ask_big", wire.holder.disk.identity, 1e12).model_dump_json().encode())
    reply = wire.redis.lrange(wire.keys.prefix_reply("ask_big"), 0, -1)
    assert reply == [Header(bytes=0).model_dump_json().encode(), b""]


def test_a_lender_sends_no_more_within_a_replys_life_than_its_bytes_in_flight(
    wire: Wire,
) -> None:
    assert wire.holder.disk is not None
    path = wire.holder.lend(ASKED, UNSCOPED)
    assert path is not None
    size = path.stat().st_size
    bounds = LendBounds(file_bytes=size, in_flight_bytes=int(1.5 * size))
    lender = Lender(wire.redis, wire.keys, "holder", wire.holder, bounds)
    for reply in ("ask_first", "ask_second"):
        lender.answer(_ask(reply, wire.holder.disk.identity, 1e12).model_dump_json().encode())
    first, second = (
        wire.redis.lrange(wire.keys.prefix_reply(r), 0, 0)[0] for r in ("ask_first", "ask_second")
    )
    assert Header.model_validate_json(first).bytes == size
    assert Header.model_validate_json(second).bytes == 0


def test_a_taker_reads_no_answer_whose_header_is_over_its_cap(wire: Wire) -> None:
    _lend(wire)
    assert wire.taker.disk is not None
    rule = FetchRule(1.0, token_bytes=1000, link_bytes_per_s=1e9)
    bounds = LendBounds(file_bytes=1000)
    taker = PrefixFetch(wire.redis, wire.keys, MODEL, "taker", 60.0, wire.taker, rule, bounds)
    assert taker(_job(ASKED)) is True
    assert wire.taker.reuse(ASKED, shared=0, scope=UNSCOPED).hits == 0


# With a fleet secret: only a file tagged under it, for the ask it answers, is kept
# (worker/runtime/prefix/lend_tag.py).

FLEET = FleetKey(b"the fleet's secret")


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "worker.runtime.prefix.prefix_fetch" and r.levelno == logging.WARNING
    ]


def test_a_taker_with_the_fleet_secret_keeps_what_a_lender_with_it_sent(wire: Wire) -> None:
    _lend(wire, FLEET)
    assert _taker(wire, fleet=FLEET)(_job(ASKED)) is True
    assert wire.taker.reuse(ASKED, shared=0, scope=UNSCOPED).hits == len(LONG)


def test_a_lender_with_the_fleet_secret_tags_its_file_for_the_ask_it_answers(wire: Wire) -> None:
    assert wire.holder.disk is not None
    lender = Lender(wire.redis, wire.keys, "holder", wire.holder, DEFAULT_BOUNDS, FLEET)
    for ask in (_ask("ask_held", wire.holder.disk.identity, 1e12), _ask("ask_no", "other", 1e12)):
        lender.answer(ask.model_dump_json().encode())
        raw, *pieces = wire.redis.lrange(wire.keys.prefix_reply(ask.reply), 0, -1)
        data = b"".join(pieces)
        header = Header.model_validate_json(raw)
        assert header.tag == (FLEET.tag(ask, data) if data else None)  # nothing sent: no tag
        assert FLEET.verifies(ask, data, header.tag) == bool(data)


@pytest.mark.parametrize("lender_key", [None, FleetKey(b"another fleet's secret")])
def test_a_taker_with_the_fleet_secret_refuses_a_file_not_tagged_under_it_and_says_so_once(
    wire: Wire, caplog: pytest.LogCaptureFixture, lender_key: FleetKey | None
) -> None:
    _lend(wire, lender_key)
    taker = _taker(wire, fleet=FLEET)
    with caplog.at_level(logging.WARNING):
        assert taker(_job(ASKED)) is True
        assert wire.taker.reuse(ASKED, shared=0, scope=UNSCOPED).hits == 0
        assert wire.taker.disk is not None and not any(wire.taker.disk.folder.iterdir())
        assert taker(_job(ASKED)) is False  # that holder is set aside, not asked again at once
    why = "no tag" if lender_key is None else "a wrong tag"
    # One line, naming the holder and why, and nothing of the prompt.
    assert _refusals(caplog) == [
        f"prefix fetch: refused a cache from holder: {why} (not sent under this MLXQ_FLEET_SECRET)"
    ]


def _one_byte_changed(data: bytes) -> bytes:
    """`data` with its last byte changed: one of the arrays', the file still loads."""
    return data[:-1] + bytes([data[-1] ^ 0x01])


@pytest.mark.parametrize("forged", ["replayed", "tampered"])
def test_a_tagged_file_moved_to_another_ask_or_changed_is_refused(wire: Wire, forged: str) -> None:
    def pieces(ask: Ask, data: bytes) -> list[str | bytes]:
        if forged == "replayed":  # a genuine answer, made for an earlier ask
            tag = FLEET.tag(ask.model_copy(update={"reply": "ask_earlier"}), data)
        else:
            tag, data = FLEET.tag(ask, data), _one_byte_changed(data)
        return [Header(bytes=len(data), tag=tag).model_dump_json(), data, b""]

    _answer_once(wire, pieces)
    assert _taker(wire, fleet=FLEET)(_job(ASKED)) is True
    assert wire.taker.reuse(ASKED, shared=0, scope=UNSCOPED).hits == 0


def test_a_changed_byte_alone_would_have_been_loaded(wire: Wire) -> None:
    """What the tag keeps out: the same changed file, untagged, to a taker without a secret."""
    _answer_once(
        wire,
        lambda _, data: [Header(bytes=len(data)).model_dump_json(), _one_byte_changed(data), b""],
    )
    assert _taker(wire)(_job(ASKED)) is True
    assert wire.taker.reuse(ASKED, shared=0, scope=UNSCOPED).hits == len(LONG)


def test_a_taker_without_a_secret_keeps_a_tagged_file_as_before(wire: Wire) -> None:
    """A fleet being given its secret, one worker at a time, keeps fetching meanwhile."""
    _lend(wire, FLEET)
    assert _taker(wire)(_job(ASKED)) is True
    assert wire.taker.reuse(ASKED, shared=0, scope=UNSCOPED).hits == len(LONG)
