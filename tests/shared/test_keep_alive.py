"""Ollama's keep_alive as requests and settings give it (shared/wire/keep_alive.py)."""

from __future__ import annotations

import pytest

from shared.wire.keep_alive import FOREVER, keep_alive_seconds


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
