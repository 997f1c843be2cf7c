"""`bench health`'s rows: each window counts only the probes sent inside it, and an attack holds
the 100 ms target only when no probe took longer and none went unanswered."""

from __future__ import annotations

from collections import Counter

from bench.health import Probe, table, window
from bench.health_attacks import Attack, idle


def test_a_window_counts_its_own_probes_and_says_whether_the_target_holds() -> None:
    attack = Attack("flood", "many requests", idle)
    probes = [Probe(0.5, 0.5, 200)] + [Probe(1 + i / 10, 0.004, 200) for i in range(10)]
    calm = window(probes, attack, 1.0, 2.0, Counter({"200": 3, "cut": 1}))
    assert (calm.probes, calm.max_ms, calm.over_target, calm.holds) == (10, 4.0, 0, True)
    assert calm.requests == "200 x3, cut x1"
    slow = window([*probes, Probe(1.95, 0.25, 200)], attack, 1.0, 2.0, Counter())
    assert (slow.over_target, slow.holds) == (1, False)
    unanswered = window([*probes, Probe(1.95, 0.01, 0)], attack, 1.0, 2.0, Counter())
    assert (unanswered.failed, unanswered.holds) == (1, False)
    text = table([calm, slow])
    assert "| flood: many requests | 200 x3, cut x1 |" in text and "| no |" in text
