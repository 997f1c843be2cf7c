"""Which idle models make room for a load (worker/pool/budget.py `to_evict`)."""

from __future__ import annotations

from worker.pool.budget import Candidate, to_evict

NOW = 10_000.0


def model(key: str, last_used: float, load_s: float = 1.0, **state: bool) -> Candidate:
    return Candidate(
        key=key,
        cost=100,
        last_used=NOW - last_used,
        load_s=load_s,
        idle=state.get("idle", True),
        pinned=state.get("pinned", False),
        loaded_at=NOW - (0 if state.get("fresh") else 1000),
    )


def keys(chosen: list[Candidate] | None) -> list[str] | None:
    return None if chosen is None else [c.key for c in chosen]


def test_what_fits_already_evicts_nothing() -> None:
    assert to_evict([model("a", 500)], need=100, free=100, now=NOW, cooldown_s=30) == []


def test_the_least_recently_used_idle_model_goes_first() -> None:
    found = [model("recent", 10), model("old", 500), model("older", 900)]
    assert keys(to_evict(found, need=150, free=50, now=NOW, cooldown_s=30)) == ["older"]


def test_a_model_slow_to_reload_is_kept_over_a_cheap_one_used_a_little_later() -> None:
    # slow: used 400 s ago, 60 s to load; cheap: used 200 s ago, 1 s to load.
    found = [model("slow", 400, load_s=60), model("cheap", 200, load_s=1)]
    assert keys(to_evict(found, need=150, free=50, now=NOW, cooldown_s=30)) == ["cheap"]


def test_busy_pinned_and_freshly_loaded_models_are_never_evicted() -> None:
    found = [
        model("busy", 900, idle=False),
        model("pinned", 900, pinned=True),
        model("fresh", 900, fresh=True),
        model("idle", 10),
    ]
    assert keys(to_evict(found, need=150, free=50, now=NOW, cooldown_s=30)) == ["idle"]


def test_a_load_that_evicting_every_idle_model_cannot_fit_waits() -> None:
    found = [model("a", 500), model("busy", 900, idle=False)]
    assert to_evict(found, need=400, free=50, now=NOW, cooldown_s=30) is None
