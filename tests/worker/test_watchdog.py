"""The progress watchdog on a hand-driven loop's counters: progress is a step completing, so a
loop that turns without stepping reads as wedged, one that keeps completing steps never does,
and the stall it reports says whether the loop is stuck inside one step."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from worker.runtime.liveness.watchdog import Watchdog

TIMEOUT_S = 0.2


@dataclass
class Counters:
    """The fields of a DrivenLoop that the watchdog reads, set by hand."""

    turns: int = 0
    steps: int = 0
    stepping_since: float | None = None
    generated: int = 0
    held: bool = True

    @property
    def busy(self) -> bool:
        return self.held

    def cancel(self, job_id: str) -> None:
        raise AssertionError("the watchdog cancels nothing")

    def run(self, stop: threading.Event) -> None:
        raise AssertionError("the watchdog runs no loop")


def test_a_loop_that_turns_but_completes_no_step_reads_as_wedged() -> None:
    loop = Counters()
    watchdog = Watchdog(loop, TIMEOUT_S, lambda _: None)
    until = time.monotonic() + TIMEOUT_S * 1.5
    stall = None
    while time.monotonic() < until and stall is None:
        loop.turns += 1  # turning, admitting nothing, stepping nothing
        stall = watchdog.wedged()
        time.sleep(0.01)
    assert stall is not None
    assert stall.in_step_s is None
    assert "no step completed" in stall.describe()


def test_a_loop_that_keeps_completing_steps_never_reads_as_wedged() -> None:
    loop = Counters()
    watchdog = Watchdog(loop, TIMEOUT_S, lambda _: None)
    until = time.monotonic() + TIMEOUT_S * 3
    while time.monotonic() < until:
        loop.stepping_since = time.monotonic()
        time.sleep(TIMEOUT_S / 2)  # a slow step, under the limit
        loop.steps, loop.stepping_since = loop.steps + 1, None
        assert watchdog.wedged() is None


def test_a_loop_stuck_inside_one_step_is_reported_as_such() -> None:
    loop = Counters(stepping_since=time.monotonic())
    watchdog = Watchdog(loop, TIMEOUT_S, lambda _: None)
    time.sleep(TIMEOUT_S * 1.2)
    stall = watchdog.wedged()
    assert stall is not None and stall.in_step_s is not None
    assert stall.in_step_s >= TIMEOUT_S
    assert "one step has run" in stall.describe()


def test_an_idle_loop_is_never_wedged_and_the_watch_starts_when_work_arrives() -> None:
    loop = Counters(held=False)
    watchdog = Watchdog(loop, TIMEOUT_S, lambda _: None)
    time.sleep(TIMEOUT_S * 1.2)
    assert watchdog.wedged() is None
    loop.held = True
    assert watchdog.wedged() is None  # the wait counts from here, not from the idle time


def test_the_watchdog_thread_calls_its_handler_once_with_the_stall() -> None:
    loop = Counters(stepping_since=time.monotonic())
    calls: list[object] = []
    stop = threading.Event()
    thread = Watchdog(loop, TIMEOUT_S, calls.append).start(stop)
    thread.join(timeout=TIMEOUT_S * 4)
    stop.set()
    assert not thread.is_alive()
    assert len(calls) == 1
