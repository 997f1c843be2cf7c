"""When a worker's last job ended, and the keep_alive it asked for: what the pool agent needs to
unload an idle model (worker/pool/agent.py), reported with each heartbeat
(worker/runtime/report.py). Written by the slot thread that ends a job, read by the heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Recency:
    at: float | None = None  # unix s; None: no job has ended yet
    keep_alive_s: float | None = None  # None: the model's own keep-alive

    def note(self, at: float, keep_alive_s: float | None) -> None:
        """A job ended at `at`; Ollama's rule: the last request's keep_alive is the model's."""
        self.at, self.keep_alive_s = at, keep_alive_s
