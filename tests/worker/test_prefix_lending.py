"""A prefix cache lent by one worker and adopted by another, without worker processes: two caches
of a tiny llama on two folders (two machines), the file between them, first as bytes, then over
the session's Redis by the lending thread and the taker, and the rule that decides whether a
fetch pays. The same across real worker processes: tests/e2e/test_prefix_fetch.py."""

from __future__ import annotations

import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache
from redis import Redis

from shared.queue.keys import Keys
from shared.queue.prefix.cache_scope import UNSCOPED
from shared.queue.prefix.prefix_blocks import HeldPrompt, block_hashes
from worker.engine.prefix_cache import PrefixCache
from worker.engine.prefix_disk import DiskTier
from worker.engine.prefix_file import file_name
from worker.engine.prefix_identity import model_identity, probe, probe_layout, token_bytes
from worker.engine.prepare import PreparedJob
from worker.ops.cluster import wait_until
from worker.runtime.prefix.prefix_fetch import (
    MIN_GAIN_TOKENS,
    RECOVER_S,
    FetchRule,
    PrefixFetch,
    held_tokens,
)
from worker.runtime.prefix.prefix_lend import Ask, Header, LendBounds, Lender

HISTORY = list(range(1, 41))
PROMPT = [*HISTORY, 50, 51]


def _cache(root: Path, model: Any, identity: str = "tiny") -> PrefixCache:
    tier = DiskTier(root, identity, probe_layout(model), 1 << 30, 4)
    return PrefixCache(model, 8, 1 << 30, tier)


def _finished(model: Any, tokens: list[int]) -> list[Any]:
    cache = make_prompt_cache(model)
    model(mx.array([tokens]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def _lent(model: Any, root: Path) -> bytes:
    """The file a holder lends for PROMPT, HISTORY's cache held only in its memory."""
    holder = _cache(root, model)
    holder.store(HISTORY, _finished(model, HISTORY), UNSCOPED)
    path = holder.lend(PROMPT, UNSCOPED)
    assert path is not None
    return path.read_bytes()


def test_a_cache_held_only_in_memory_is_written_and_lent(model: Any, tmp_path: Path) -> None:
    holder = _cache(tmp_path / "holder", model)
    holder.store(HISTORY, _finished(model, HISTORY), UNSCOPED)
    path = holder.lend(PROMPT, UNSCOPED)
    assert path is not None and path.name == file_name(HeldPrompt(UNSCOPED, HISTORY))


def test_nothing_is_lent_for_a_prompt_the_cache_does_not_hold(model: Any, tmp_path: Path) -> None:
    holder = _cache(tmp_path, model)
    holder.store(HISTORY, _finished(model, HISTORY), UNSCOPED)
    assert holder.lend([99, 98, *HISTORY], UNSCOPED) is None


def test_a_lent_file_is_adopted_and_serves_the_prompt_as_its_own_prefill_would(
    model: Any, tmp_path: Path
) -> None:
    taker = _cache(tmp_path / "taker", model)
    assert taker.disk is not None
    assert taker.disk.adopt(_lent(model, tmp_path / "holder"), UNSCOPED) == HISTORY
    reuse = taker.reuse(PROMPT, shared=0, scope=UNSCOPED)
    assert reuse.hits == len(HISTORY)
    assert reuse.cache is not None
    fetched = model(mx.array([PROMPT[len(HISTORY) :]]), cache=reuse.cache)[0, -1]
    fresh = model(mx.array([PROMPT]), cache=make_prompt_cache(model))[0, -1]
    assert mx.allclose(fetched, fresh, atol=1e-4).item()


@pytest.mark.parametrize("junk", [b"", b"not a cache", os.urandom(4096)])
def test_junk_sent_as_a_cache_is_refused_and_leaves_nothing(
    model: Any, tmp_path: Path, junk: bytes
) -> None:
    taker = _cache(tmp_path, model)
    assert taker.disk is not None
    assert taker.disk.adopt(junk, UNSCOPED) is None
    assert not any(taker.disk.folder.iterdir())
    assert taker.reuse(PROMPT, shared=0, scope=UNSCOPED).hits == 0


def test_another_models_cache_is_refused(model: Any, tmp_path: Path) -> None:
    taker = _cache(tmp_path / "taker", model, identity="another-model")
    assert taker.disk is not None
    assert taker.disk.adopt(_lent(model, tmp_path / "holder"), UNSCOPED) is None
    assert not any(taker.disk.folder.iterdir())


def test_the_identity_is_the_same_for_the_same_weights_written_elsewhere_at_another_time(
    tmp_path: Path,
) -> None:
    here = tmp_path / "here" / "model"
    here.mkdir(parents=True)
    (here / "config.json").write_text("{}")
    (here / "model.safetensors").write_bytes(os.urandom(1 << 20))
    there = tmp_path / "there" / "model"
    shutil.copytree(here, there)
    os.utime(there / "model.safetensors", (1, 1))
    assert model_identity(here, "float32") == model_identity(there, "float32")


def test_the_identity_changes_with_the_weights_at_the_same_size(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(bytes(1 << 20))
    before = model_identity(tmp_path, "float32")
    with weights.open("r+b") as file:  # one byte
        file.seek((1 << 20) // 2 + 1)
        file.write(b"\x01")
    assert model_identity(tmp_path, "float32") != before


def test_a_hub_blob_is_named_by_its_content_hash(tmp_path: Path) -> None:
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    snapshot = tmp_path / "snapshots" / "model"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    for name in ("a" * 64, "b" * 64):
        (blobs / name).write_bytes(b"same bytes")
        (snapshot / "model.safetensors").unlink(missing_ok=True)
        (snapshot / "model.safetensors").symlink_to(blobs / name)
        if name == "a" * 64:
            before = model_identity(snapshot, "float32")
    assert model_identity(snapshot, "float32") != before


def test_a_token_costs_what_the_files_grow_by(model: Any, tmp_path: Path) -> None:
    per_token = token_bytes(probe(model))
    small, large = _cache(tmp_path, model), [99, *range(1, 81)]  # no prefix of the other
    for tokens in (HISTORY, large):
        small.store(tokens, _finished(model, tokens), UNSCOPED)
    small.persist_all()
    assert small.disk is not None
    sizes = [
        (small.disk.folder / file_name(HeldPrompt(UNSCOPED, t))).stat().st_size
        for t in (HISTORY, large)
    ]
    grown = per_token * (len(large) - len(HISTORY))
    assert grown <= sizes[1] - sizes[0] <= grown * 1.05  # and the tokens' text in the header


def test_held_tokens_is_the_longest_common_start_in_the_prompts_scope() -> None:
    held = tuple(HeldPrompt(UNSCOPED, t) for t in ([1, 2, 3, 4], [1, 2, 9], [7, 8]))
    held += (HeldPrompt("other", [1, 2, 3, 5, 6]),)
    assert held_tokens(held, HeldPrompt(UNSCOPED, [1, 2, 3, 5, 6])) == 3
    assert held_tokens(held, HeldPrompt(UNSCOPED, [5])) == 0
    assert held_tokens(held, HeldPrompt("third", [1, 2])) == 0
    assert held_tokens((), HeldPrompt(UNSCOPED, [1, 2])) == 0


# The default model on this CPU: 4.4 ms a prompt token, 46 KB a float32 token.
RULE = FetchRule(prefill_s_per_token=0.0044, token_bytes=46_080, link_bytes_per_s=100e6)


def test_a_fetch_pays_when_the_link_moves_the_cache_faster_than_its_prefill() -> None:
    wait = RULE.wait_s(gain=2000, tokens=2000)  # 8.8 s of prefill against about 1 s
    assert wait is not None and wait == pytest.approx(4.4)


def test_a_fetch_does_not_pay_over_a_slow_link_or_for_a_few_tokens() -> None:
    slow = FetchRule(0.0044, 46_080, link_bytes_per_s=5e6)  # 18 s for 2,000 tokens
    assert slow.wait_s(gain=2000, tokens=2000) is None
    assert RULE.wait_s(gain=MIN_GAIN_TOKENS - 1, tokens=4000) is None
    # most of the holder's tokens held here already: moving them all saves too little
    assert RULE.wait_s(gain=300, tokens=20_000) is None
    assert FetchRule(0.0044, 0, 100e6).wait_s(gain=2000, tokens=2000) is None


def test_the_link_rate_follows_what_fetches_measure_until_it_is_old() -> None:
    rule = FetchRule(0.0044, 46_080, link_bytes_per_s=100e6)
    for _ in range(8):
        rule.measured(nbytes=10_000_000, seconds=1.0)  # 10 MB/s
    assert rule.rate() == pytest.approx(10e6, rel=0.05)
    assert rule.wait_s(gain=2000, tokens=2000) is None
    rule.measured_at -= RECOVER_S  # a slow link is tried again, at the configured rate
    assert rule.rate() == 100e6
    assert rule.wait_s(gain=2000, tokens=2000) is not None


# The wire, on the session's Redis: a lending thread and a taker, as two workers run them.

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


def _taker(wire: Wire, prefill_s_per_token: float = 1.0) -> PrefixFetch:
    assert wire.taker.disk is not None
    rule = FetchRule(prefill_s_per_token, token_bytes=1000, link_bytes_per_s=1e9)
    return PrefixFetch(wire.redis, wire.keys, MODEL, "taker", 60.0, wire.taker, rule)


def _job(prompt: list[int]) -> PreparedJob:
    return PreparedJob("job", (prompt,), max_tokens=1, choices=(), stops=())


def _lend(wire: Wire) -> Lender:
    lender = Lender(wire.redis, wire.keys, "holder", wire.holder)
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


def test_an_answer_whose_length_is_not_its_headers_is_dropped(wire: Wire) -> None:
    """As a piece lost or sent twice would leave it: the file is whole, the header says not."""
    assert wire.holder.disk is not None
    wire.redis.set(wire.keys.lends("holder"), wire.holder.disk.identity)
    path = wire.holder.lend(ASKED, UNSCOPED)
    assert path is not None
    data = path.read_bytes()

    def answer() -> None:
        got = wire.redis.blpop([wire.keys.prefix_asks("holder")], timeout=10)
        assert got is not None
        reply = wire.keys.prefix_reply(Ask.model_validate_json(got[1]).reply)
        header = Header(bytes=len(data) + 1).model_dump_json()
        wire.redis.rpush(reply, header, data, b"")

    threading.Thread(target=answer, daemon=True).start()
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


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_a_longer_held_sequence_is_lent_cut_to_what_the_prompt_shares(
    model: Any, tmp_path: Path, where: str
) -> None:
    holder = _cache(tmp_path, model)
    longer = [*HISTORY, *range(60, 90)]
    holder.store(longer, _finished(model, longer), UNSCOPED)
    if where == "disk":
        holder.close()
        holder = _cache(tmp_path, model)  # a restart: its files only
    path = holder.lend([*HISTORY, 95], UNSCOPED)
    assert path is not None and path.name == file_name(HeldPrompt(UNSCOPED, HISTORY))
    taker = _cache(tmp_path / "taker", model)
    assert taker.disk is not None and taker.disk.adopt(path.read_bytes(), UNSCOPED) == HISTORY


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
