"""The prefill budget's rule (worker/engine/prefill_policy.py), as plain numbers: the cap and
the time while sequences decode, and the burst that passes the time for whole short prompts."""

from __future__ import annotations

from worker.engine.batch.types import PrefillBudget
from worker.engine.prefill_policy import (
    FIRST_CHUNK,
    IDLE_SECONDS,
    MIN_PREFILL_TOKENS,
    PrefillPolicy,
)

# 4,096 a step with nothing decoding, 256 in chunks while decoding, 0.4 s at the measured rate.
POLICY = PrefillPolicy(tokens=4096, decoding_cap=256, seconds=0.4, burst=True)
RATE = 250.0  # prompt tokens a second: 0.4 s is 100 tokens


def test_with_nothing_decoding_a_step_takes_the_whole_budget_that_its_time_allows() -> None:
    assert POLICY.budget(False, 1000.0, lambda: True) == PrefillBudget.flat(4096)
    timed = int(RATE * IDLE_SECONDS)  # 2,500: about 10 s, never a minute on a slow machine
    assert POLICY.budget(False, RATE, lambda: True) == PrefillBudget.flat(timed)


def test_with_nothing_decoding_and_no_rate_yet_long_prompts_go_a_chunk_a_step() -> None:
    first = POLICY.budget(False, None, lambda: True)
    assert first == PrefillBudget(4096, FIRST_CHUNK, FIRST_CHUNK)


def test_while_decoding_a_step_takes_what_the_time_allows() -> None:
    assert POLICY.budget(True, RATE, lambda: False) == PrefillBudget(100, 100, 256)


def test_a_slow_machine_still_moves_prompts_by_the_floor() -> None:
    slow = POLICY.budget(True, 1.0, lambda: False)
    assert (slow.tokens, slow.partial) == (MIN_PREFILL_TOKENS, MIN_PREFILL_TOKENS)


def test_a_burst_takes_whole_short_prompts_past_the_time_and_chunks_within_it() -> None:
    assert POLICY.budget(True, RATE, lambda: True) == PrefillBudget(4096, 100, 256)


def test_without_the_burst_rule_a_burst_keeps_the_time() -> None:
    off = PrefillPolicy(tokens=4096, decoding_cap=256, seconds=0.4, burst=False)
    assert off.budget(True, RATE, lambda: True) == PrefillBudget(100, 100, 256)


def test_an_unmeasured_rate_or_no_time_limit_leaves_the_cap_alone() -> None:
    assert POLICY.budget(True, None, lambda: True) == PrefillBudget.flat(256)
    untimed = PrefillPolicy(tokens=4096, decoding_cap=256, seconds=None, burst=True)
    assert untimed.budget(True, RATE, lambda: True) == PrefillBudget.flat(256)
