"""Ollama's keep_alive as requests and settings give it (shared/wire/fleet/keep_alive.py), and who
may set a shared model's lifetime: operators alone unload or pin it, other keys only lengthen its
stay (the pool's rule, and each worker's record of what its requests asked)."""

from __future__ import annotations

import pytest

from shared.wire.errors import InvalidRequestError
from shared.wire.fleet.keep_alive import FOREVER, asked, keep_alive_seconds, stay_s
from worker.runtime.recency import Recency


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("90s", 90.0),
        ("500ms", 0.5),
        ("2.5s", 2.5),
        (300, 300.0),
        ("300", 300.0),
        (0, 0.0),
        ("0", 0.0),
        (-1, FOREVER),
        ("-1", FOREVER),
        ("-5m", FOREVER),
    ],
)
def test_keep_alive_reads_durations_seconds_zero_and_negatives_as_ollama_does(
    given: str | int, seconds: float
) -> None:
    assert keep_alive_seconds(given) == seconds


@pytest.mark.parametrize("given", ["forever", "5 m", "m", "", "5x", True, None, float("nan")])
def test_keep_alive_refuses_what_is_no_duration(given: object) -> None:
    with pytest.raises(ValueError):
        keep_alive_seconds(given)


def test_only_an_operator_may_unload_or_pin_a_shared_model_by_request() -> None:
    for seconds in (0.0, FOREVER):
        assert asked(seconds, operator=True, longest=3600) == seconds
        with pytest.raises(InvalidRequestError) as refused:
            asked(seconds, operator=False, longest=3600)
        assert refused.value.param == "keep_alive"
    assert asked(None, operator=False, longest=3600) is None


def test_another_keys_keep_alive_is_capped_at_the_longest() -> None:
    assert asked(86400.0, operator=False, longest=3600) == 3600
    assert asked(60.0, operator=False, longest=3600) == 60
    assert asked(86400.0, operator=True, longest=3600) == 86400


def test_a_request_lengthens_a_models_stay_and_never_shortens_it() -> None:
    assert stay_s(None, own=300) == 300
    assert stay_s(10, own=300) == 300  # a key cannot unload it early for the others
    assert stay_s(1800, own=300) == 1800
    assert stay_s(0, own=300) == 0 and stay_s(FOREVER, own=300) == FOREVER  # operators' orders
    assert stay_s(1800, own=FOREVER) == FOREVER


def test_each_request_only_lengthens_what_an_earlier_one_asked() -> None:
    recency = Recency()
    recency.note(1000.0, 1800.0)  # stays until 2800
    recency.note(1100.0, 60.0)  # a later, shorter ask
    assert recency.at is not None and recency.keep_alive_s is not None
    assert recency.at + recency.keep_alive_s == 2800.0
    recency.note(1150.0, None)  # a request that asks nothing
    assert recency.at + recency.keep_alive_s == 2800.0
    recency.note(1200.0, 0.0)  # an operator's unload
    assert recency.keep_alive_s == 0.0
