"""The progress watchdog: a worker whose engine loop holds work but stops turning is wedged.

The heartbeat has its own thread, so a worker whose loop deadlocks, or spins inside one step,
still looks alive to everyone else. This thread reads the loop's turn counter four times per
`timeout_s`; when the loop holds work (running or admitted jobs) and the counter has not moved
for `timeout_s`, it calls `on_wedged` once. serve.py's handler hands the worker's jobs back
(worker/runtime/reaper.py) and ends the process with a non-zero status, so that its supervisor
(launchd, systemd, a container runtime) starts a fresh one. An idle loop turns every 0.2 s,
and a busy one once per step, so `timeout_s` must exceed the slowest single step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from worker.runtime.loop import DrivenLoop


class Watchdog:
    def __init__(self, loop: DrivenLoop, timeout_s: float, on_wedged: Callable[[], None]):
        self._loop = loop
        self._timeout_s = timeout_s
        self._on_wedged = on_wedged
        self._turns = loop.turns
        self._since = time.monotonic()

    def wedged(self) -> bool:
        """Whether the loop holds work and has not turned for `timeout_s` (call periodically)."""
        now = time.monotonic()
        turns = self._loop.turns
        if turns != self._turns or not self._loop.busy:
            self._turns, self._since = turns, now
            return False
        return now - self._since >= self._timeout_s

    def start(self, stop: threading.Event) -> threading.Thread:
        def run() -> None:
            while not stop.wait(self._timeout_s / 4):
                if self.wedged():
                    self._on_wedged()
                    return

        thread = threading.Thread(target=run, name="watchdog", daemon=True)
        thread.start()
        return thread
