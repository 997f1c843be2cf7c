"""When a worker's last job ended, and the keep_alive it asked for: what the pool agent needs to
unload an idle model (worker/pool/agent.py), reported with each heartbeat
(worker/runtime/report.py). Written by the slot thread that ends a job, read by the heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.wire.fleet.keep_alive import FOREVER


@dataclass
class Recency:
    at: float | None = None  # unix s; None: no job has ended yet
    keep_alive_s: float | None = None  # None: the model's own keep-alive

    def note(self, at: float, keep_alive_s: float | None) -> None:
        """A job ended at `at`, having asked `keep_alive_s`: the model stays at least as long as
        an earlier request asked (no key shortens another's: shared/wire/fleet/keep_alive.py), but
        an operator's 0 or FOREVER is its order, as it is."""
        earlier = self.keep_alive_s
        if keep_alive_s in (0, FOREVER):
            pass
        elif earlier == FOREVER:
            keep_alive_s = FOREVER
        elif earlier and self.at is not None and (left := self.at + earlier - at) > 0:
            keep_alive_s = left if keep_alive_s is None else max(keep_alive_s, left)
        self.at, self.keep_alive_s = at, keep_alive_s
