"""A synthetic embedding engine: no model, one input's vector per step. For plumbing tests.

It has the embedding engine's surface (worker/engine/embedding/engine.py: `prepare`, `insert`,
`step`, `remove`), so the engine loop and job function run it as they run the real one. An input
"costs" one token per word (a token-id input its ids); each step takes `step_s` and gives the
next queued input's vector, `dimensions` zeros, so a job of many inputs runs for many steps and
can be cancelled in the middle.
"""

from __future__ import annotations

import time
from collections import deque

from shared.queue.jobs import EmbeddingJob
from worker.engine.embedding.engine import EmbeddingOutput, PreparedEmbedding


class SyntheticEmbeddingEngine:
    def __init__(self, step_s: float, dimensions: int = 4):
        self._step_s = step_s
        self._vector = bytes(4 * dimensions)  # little-endian float32 zeros
        self._queue: deque[tuple[str, int]] = deque()  # (job id, input index)
        self._left: dict[str, int] = {}  # job id -> inputs not yet given
        self._tokens: dict[str, int] = {}  # job id -> its prompt tokens

    def prepare(self, job: EmbeddingJob) -> PreparedEmbedding:
        inputs = [
            item if isinstance(item, list) else [0] * len(item.split()) for item in job.inputs
        ]
        return PreparedEmbedding(job.job_id, inputs)

    def insert(self, prepared: PreparedEmbedding) -> None:
        self._queue.extend((prepared.job_id, i) for i in range(len(prepared.inputs)))
        self._left[prepared.job_id] = len(prepared.inputs)
        self._tokens[prepared.job_id] = prepared.prompt_tokens

    def remove(self, job_ids: list[str]) -> None:
        gone = set(job_ids)
        self._queue = deque(q for q in self._queue if q[0] not in gone)
        for job_id in gone:
            self._left.pop(job_id, None)
            self._tokens.pop(job_id, None)

    def step(self) -> list[EmbeddingOutput]:
        time.sleep(self._step_s)
        if not self._queue:
            return []
        job_id, index = self._queue.popleft()
        self._left[job_id] -= 1
        ends = self._left[job_id] == 0
        out = EmbeddingOutput(job_id, index, self._vector, ends, self._tokens[job_id])
        if ends:
            self.remove([job_id])
        return [out]
