"""A synthetic engine: no model, tokens at a fixed rate. For relay benchmarks and plumbing tests.

It has the real engine's surface (`BatchEngine`), so the whole worker (RQ slots, engine loop,
publishing) runs as usual; only the model is replaced. Every step emits one token per running
choice whose text is the wall-clock time it was made (`"<unix time> "`), so a client can
measure the latency the relay adds. A prompt "costs" one token per word. Labelled "synthetic"
wherever it appears; never used unless MLXQ_ENGINE=synthetic.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from shared.queue.jobs import GenerationJob
from worker.engine.batch import StepOutput
from worker.engine.prepare import ChoiceSetup, PreparedJob
from worker.engine.sampling import greedy


@dataclass
class _Running:
    prepared: PreparedJob
    generated: int = 0


class SyntheticEngine:
    def __init__(self, step_s: float, default_max_tokens: int):
        self._step_s = step_s
        self._default_max_tokens = default_max_tokens
        self._running: dict[str, _Running] = {}
        self._next_step_at = time.monotonic()

    def prepare(self, job: GenerationJob) -> PreparedJob:
        if job.messages is not None:
            words = sum(len(m.text().split()) for m in job.messages)
        else:
            words = sum(
                len(i.split()) if isinstance(i, str) else len(i) for i in job.prompt_items()
            )
        return PreparedJob(
            job_id=job.job_id,
            prompts=([0] * max(1, words),),
            max_tokens=job.max_tokens or self._default_max_tokens,
            choices=tuple(ChoiceSetup(greedy) for _ in range(job.choices())),
            stops=tuple(job.stop),
        )

    def insert(self, prepared: PreparedJob) -> None:
        self._running[prepared.job_id] = _Running(prepared)

    def step(self) -> list[StepOutput]:
        self._wait_for_tick()
        stamp = f"{time.time():.6f} "
        outputs = [o for r in self._running.values() for o in self._advance(r, stamp)]
        self.remove([o.job_id for o in outputs if o.ends_job])
        return outputs

    def _wait_for_tick(self) -> None:
        now = time.monotonic()
        if self._next_step_at > now:
            time.sleep(self._next_step_at - now)
        self._next_step_at = max(now, self._next_step_at) + self._step_s

    def _advance(self, run: _Running, stamp: str) -> list[StepOutput]:
        """One token for each of the job's choices; all of them end at the same step."""
        run.generated += 1
        done = run.generated >= run.prepared.max_tokens
        n = len(run.prepared.choices)
        return [
            StepOutput(
                job_id=run.prepared.job_id,
                text=stamp,
                finish_reason="length" if done else None,
                prompt_tokens=run.prepared.prompt_tokens,
                completion_tokens=run.generated * (i + 1),
                index=i,
                choices_left=n - 1 - i if done else n,
            )
            for i in range(n)
        ]

    def remove(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            self._running.pop(job_id, None)
