"""Graceful shutdown: on SIGTERM a worker stops taking jobs, finishes its batch, and leaves.

1. Its RQ slots stop dequeuing (a job popped meanwhile goes back to the front of its queue).
2. The engine loop runs on, cancellations included, until it holds no job, for at most
   `drain_timeout_s`; a second SIGTERM/SIGINT cuts this short.
3. The loop stops. serve.py hands back what is still held (worker/runtime/liveness/reaper.py: bulk
jobs go back
   to their queue, interactive ones fail with `worker_lost`, as their stream cannot restart
   elsewhere), deregisters the worker and exits 0.
A rolling restart therefore loses nothing as long as the drain timeout covers the longest
generation: start the new worker, then SIGTERM the old one.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType

from worker.runtime.intake.slots import SlotWorker, slots_idle, stop_slots
from worker.runtime.loop import DrivenLoop

log = logging.getLogger(__name__)


class Drain:
    def __init__(self, slots: list[SlotWorker], loop: DrivenLoop, timeout_s: float):
        self._slots = slots
        self._loop = loop
        self._timeout_s = timeout_s
        self.requested = threading.Event()
        self._hurry = threading.Event()
        # Set when the loop must stop: after the drain, or at once on a second signal.
        self.loop_stop = threading.Event()

    def on_signals(self) -> None:
        """SIGTERM and SIGINT start the drain; a second one ends it."""

        def handle(signum: int, frame: FrameType | None) -> None:
            name = signal.Signals(signum).name
            if self.requested.is_set():
                log.info("got %s again: stopping now", name)
                self._hurry.set()
                return
            log.info("got %s: draining (at most %.0f s)", name, self._timeout_s)
            self.requested.set()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)
        threading.Thread(target=self._run, name="drain", daemon=True).start()

    def _run(self) -> None:
        self.requested.wait()
        stop_slots(self._slots)
        deadline = time.monotonic() + self._timeout_s
        while not self._hurry.is_set() and time.monotonic() < deadline:
            if slots_idle(self._slots) and not self._loop.busy:
                log.info("drained: no job left")
                break
            time.sleep(0.05)
        else:
            log.warning("drain timeout: handing back the jobs still running")
        self.loop_stop.set()
