"""The progress watchdog: a worker whose engine loop holds work but completes no step is wedged.

The heartbeat has its own thread, so a worker whose loop deadlocks, or spins inside one step,
still looks alive to everyone else. Progress is a step completing (the loop's `steps`), not the
loop turning: a loop that turns while holding work but never steps it is as stuck as one blocked
inside a step. This thread reads the counter four times per `timeout_s`; when the loop holds
work (running or admitted jobs) and no step has completed for `timeout_s`, it calls `on_wedged`
once, with what it saw (`Stall`): stuck inside one step, or turning without stepping. serve.py's
handler hands the worker's jobs back (worker/runtime/liveness/reaper.py) and ends the process with a
non-zero status, so that its supervisor (launchd, systemd, a container runtime) starts a fresh
one.

A step is bounded by the engine's step budget (worker/engine/generation/engine.py,
MLXQ_PREFILL_TOKENS while nothing decodes), so `timeout_s` must exceed the slowest such step on
the machine (MLXQ_WATCHDOG_S); what no budget bounds (a deadlock, a forward that never returns)
is what trips it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from worker.runtime.loop import DrivenLoop


@dataclass(frozen=True)
class Stall:
    """What the watchdog saw when it called the loop wedged."""

    idle_s: float  # since the last step completed (or the loop first held work)
    in_step_s: float | None  # how long the step under way has run; None: the loop is between steps

    def describe(self) -> str:
        if self.in_step_s is None:
            return f"no step completed for {self.idle_s:.0f} s while holding jobs"
        return f"one step has run for {self.in_step_s:.0f} s while holding jobs"


class Watchdog:
    def __init__(self, loop: DrivenLoop, timeout_s: float, on_wedged: Callable[[Stall], None]):
        self._loop = loop
        self._timeout_s = timeout_s
        self._on_wedged = on_wedged
        self._steps = loop.steps
        self._since = time.monotonic()

    def wedged(self) -> Stall | None:
        """What the loop's stall looks like, when it holds work and has completed no step for
        `timeout_s`; None while it makes progress or holds nothing (call periodically)."""
        now = time.monotonic()
        steps = self._loop.steps
        if steps != self._steps or not self._loop.busy:
            self._steps, self._since = steps, now
            return None
        if now - self._since < self._timeout_s:
            return None
        began = self._loop.stepping_since
        return Stall(now - self._since, None if began is None else now - began)

    def start(self, stop: threading.Event) -> threading.Thread:
        def run() -> None:
            while not stop.wait(self._timeout_s / 4):
                if (stall := self.wedged()) is not None:
                    self._on_wedged(stall)
                    return

        thread = threading.Thread(target=run, name="watchdog", daemon=True)
        thread.start()
        return thread
