"""A thread that asks an API's `GET /health` at a fixed period and records each answer: how the
benchmarks that load the API (bench/health.py, bench/intake.py) see whether its event loop
still answers at once."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class Probe:
    """One /health request: when it was sent (perf_counter s), how long it took, its status
    (0: no answer within the poller's timeout)."""

    sent: float
    took_s: float
    status: int


class HealthPoller(threading.Thread):
    """Asks `{url}/health` every `every_s` until `stopping` is set."""

    def __init__(self, url: str, every_s: float, timeout_s: float):
        super().__init__(daemon=True)
        self._url = f"{url}/health"
        self._every_s = every_s
        self._timeout_s = timeout_s
        self.probes: list[Probe] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=self._timeout_s) as http:
            while not self.stopping.is_set():
                sent = time.perf_counter()
                try:
                    status = http.get(self._url).status_code
                except httpx.HTTPError:
                    status = 0
                self.probes.append(Probe(sent, time.perf_counter() - sent, status))
                self.stopping.wait(self._every_s)

    def between_ms(self, start: float, end: float) -> list[float]:
        """The latencies, in ms, of the probes sent from `start` to `end` (perf_counter s)."""
        return [1000 * p.took_s for p in self.probes if start <= p.sent <= end]

    def answered_after(self, moment: float) -> None:
        """Wait until a probe sent after `moment` is answered: every probe sent before it is then
        recorded, however long it took."""
        deadline = time.perf_counter() + self._timeout_s + 5
        while time.perf_counter() < deadline and not any(p.sent > moment for p in self.probes[-3:]):
            time.sleep(self._every_s)
