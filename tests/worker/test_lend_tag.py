"""The tag of a lent prefix-cache file (worker/runtime/prefix/lend_tag.py): the one made for an
ask and its file verifies, and nothing else does: another secret, a byte changed, the answer
to another ask, no tag. Over the wire, between a lending thread and a taker:
tests/worker/test_prefix_lending.py."""

from __future__ import annotations

import os

import pytest
from pydantic import SecretStr

from shared.queue.config import Settings
from shared.queue.prefix.cache_scope import UNSCOPED
from worker.runtime.prefix.lend_tag import FleetKey
from worker.runtime.prefix.prefix_lend import Ask

FILE = os.urandom(1 << 16)
KEY = FleetKey(b"the fleet's secret")
ASK = Ask(reply="ask_one", identity="tiny", scope=UNSCOPED, tokens=[1, 2, 3], until=1e12)


def _asked(**changed: str) -> Ask:
    return ASK.model_copy(update=changed)


def test_the_tag_made_for_an_ask_and_its_file_verifies() -> None:
    assert KEY.verifies(ASK, FILE, KEY.tag(ASK, FILE))
    assert KEY.verifies(ASK, memoryview(FILE), KEY.tag(ASK, memoryview(FILE)))


def test_a_tag_made_under_another_secret_is_refused() -> None:
    assert not KEY.verifies(ASK, FILE, FleetKey(b"another secret").tag(ASK, FILE))


@pytest.mark.parametrize("at", [0, len(FILE) // 2, len(FILE) - 1])
def test_a_file_with_one_byte_changed_is_refused(at: int) -> None:
    tampered = bytearray(FILE)
    tampered[at] ^= 0x01
    assert not KEY.verifies(ASK, bytes(tampered), KEY.tag(ASK, FILE))


def test_a_file_cut_short_or_grown_is_refused() -> None:
    tag = KEY.tag(ASK, FILE)
    assert not KEY.verifies(ASK, FILE[:-1], tag)
    assert not KEY.verifies(ASK, FILE + b"\x00", tag)


@pytest.mark.parametrize(
    "other", [{"reply": "ask_two"}, {"identity": "another-model"}, {"scope": "team"}]
)
def test_an_answer_replayed_to_another_ask_is_refused(other: dict[str, str]) -> None:
    assert not KEY.verifies(_asked(**other), FILE, KEY.tag(ASK, FILE))


def test_a_field_moved_across_the_boundary_of_the_next_is_another_message() -> None:
    """Each field goes in after its length, so "ask_o" + "netiny" is not "ask_one" + "tiny"."""
    shifted = _asked(reply="ask_o", identity="netiny")
    assert not KEY.verifies(shifted, FILE, KEY.tag(ASK, FILE))


@pytest.mark.parametrize("tag", [None, "", "0" * 64, "é" * 64])
def test_a_missing_or_made_up_tag_is_refused_without_raising(tag: str | None) -> None:
    assert not KEY.verifies(ASK, FILE, tag)


def test_no_fleet_secret_is_no_key() -> None:
    assert FleetKey.configured(None) is None
    assert FleetKey.configured(SecretStr("")) is None
    key = FleetKey.configured(SecretStr("the fleet's secret"))
    assert key is not None and key.tag(ASK, FILE) == KEY.tag(ASK, FILE)


def test_the_fleet_secret_comes_from_its_variable_and_is_never_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().fleet_secret is None
    monkeypatch.setenv("MLXQ_FLEET_SECRET", "hush-fleet")
    settings = Settings()
    assert settings.fleet_secret is not None
    assert settings.fleet_secret.get_secret_value() == "hush-fleet"
    assert "hush-fleet" not in repr(settings) and "hush-fleet" not in str(settings)
