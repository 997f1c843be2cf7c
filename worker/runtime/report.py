"""The worker's report of itself, built once per heartbeat (shared/observe/fleet.py WorkerStats).

Slots in use come from what the RQ slots hold (worker/runtime/intake/slots.py), split by the lane of
the queue each job came from. Tokens/s is the engine loop's token counter over the last minute: one
sample per heartbeat, kept for WINDOW_S; nothing is counted per token here. Prefix-cache
figures are counted per ended job (worker/runtime/prefix/prefix_report.py), and so is when the last
job ended, with the keep_alive it asked for (worker/runtime/recency.py), which the pool agent
reads to unload an idle model (worker/pool/agent.py).
"""

from __future__ import annotations

import socket
import time
from collections import deque
from collections.abc import Callable

from shared.observe.fleet import WorkerStats
from shared.queue.jobs import LANES, Lane
from shared.queue.keys import Keys
from worker.runtime.loop import DrivenLoop
from worker.runtime.prefix.prefix_report import PrefixFigures
from worker.runtime.recency import Recency

WINDOW_S = 60.0


class Reporter:
    def __init__(
        self,
        loop: DrivenLoop,
        held: Callable[[], dict[str, str]],
        keys: Keys,
        model: str,
        worker_id: str,
        batch_size: int,
        figures: PrefixFigures | None = None,
        recency: Recency | None = None,
    ):
        self._figures = figures or PrefixFigures()
        self._recency = recency or Recency()
        self._loop = loop
        self._held = held
        self._lanes: dict[str, Lane] = {keys.lane(model, lane): lane for lane in LANES}
        self._model = model
        self._worker_id = worker_id
        self._batch_size = batch_size
        self._started_at = time.time()
        self._samples: deque[tuple[float, int]] = deque()

    def tokens_per_s(self, now: float, generated: int) -> float:
        """Tokens generated per second since the oldest sample of the last WINDOW_S."""
        self._samples.append((now, generated))
        while len(self._samples) > 1 and self._samples[0][0] < now - WINDOW_S:
            self._samples.popleft()
        then, before = self._samples[0]
        return round((generated - before) / (now - then), 2) if now > then else 0.0

    def stats(self) -> WorkerStats:
        running: dict[Lane, int] = dict.fromkeys(LANES, 0)
        for queue in self._held().values():
            running[self._lanes.get(queue, "interactive")] += 1
        generated = self._loop.generated
        return WorkerStats(
            worker_id=self._worker_id,
            host=socket.gethostname(),
            model=self._model,
            batch_size=self._batch_size,
            running=running,
            tokens_per_s=self.tokens_per_s(time.monotonic(), generated),
            generated_tokens=generated,
            started_at=self._started_at,
            prefix_cache_queries=self._figures.queries,
            prefix_cache_hits=self._figures.hits,
            last_job_at=self._recency.at,
            keep_alive_s=self._recency.keep_alive_s,
        )
