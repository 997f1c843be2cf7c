"""A synthetic engine: no model, tokens at a fixed rate. For relay benchmarks and plumbing tests.

It has the real engine's surface (`BatchEngine`), so the whole worker (RQ slots, engine loop,
publishing) runs as usual; only the model is replaced. Every step emits one token per running
choice whose text is the wall-clock time it was made (`"<unix time> "`), so a client can
measure the latency the relay adds. A prompt "costs" one token per word, and nothing else.
Labelled "synthetic" wherever it appears; never used unless MLXQ_ENGINE=synthetic.

Given a `SyntheticPrefill` (MLXQ_SYNTHETIC_PREFILL_S_PER_TOKEN above 0), prompts are the served
model's real token ids, and a step that prefills N tokens its cache lacks takes N x that cost
longer, so every running sequence waits for it, as on a real worker; a sequence's first token
comes with the step that ends its prefill (worker/engine/doubles/synthetic_prefill.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from shared.queue.jobs import GenerationJob
from worker.engine.doubles.synthetic_prefill import PrefillState, SyntheticPrefill
from worker.engine.generation.step_output import StepOutput
from worker.engine.prepare import ChoiceSetup, PreparedJob
from worker.engine.sequence.sampling import greedy


@dataclass
class _Running:
    prepared: PreparedJob
    generated: int = 0
    prefill: PrefillState | None = None  # with a prefill model: until its prefill ends
    answer: list[str] = field(default_factory=list)  # with a prefill model: for its cache


class SyntheticEngine:
    def __init__(
        self, step_s: float, default_max_tokens: int, prefill: SyntheticPrefill | None = None
    ):
        self._step_s = step_s
        self._default_max_tokens = default_max_tokens
        self._prefill = prefill
        self._running: dict[str, _Running] = {}
        self._next_step_at = time.monotonic()

    def prepare(self, job: GenerationJob) -> PreparedJob:
        return PreparedJob(
            job_id=job.job_id,
            prompts=self._prompts(job),
            max_tokens=job.max_tokens or self._default_max_tokens,
            choices=tuple(ChoiceSetup(greedy) for _ in range(job.choices())),
            stops=tuple(job.stop),
            cache_scope=job.cache_scope,
        )

    def _prompts(self, job: GenerationJob) -> tuple[list[int], ...]:
        if self._prefill is not None:
            return self._prefill.prompts(job)
        if job.messages is not None:
            words = sum(len(m.text().split()) for m in job.messages)
        else:
            words = sum(
                len(i.split()) if isinstance(i, str) else len(i) for i in job.prompt_items()
            )
        return ([0] * max(1, words),)

    def insert(self, prepared: PreparedJob) -> None:
        state = PrefillState() if self._prefill is not None else None
        self._running[prepared.job_id] = _Running(prepared, prefill=state)

    def step(self) -> list[StepOutput]:
        self._wait_for_tick(self._prefill_s())
        stamp = f"{time.time():.6f} "
        ready = [r for r in self._running.values() if r.prefill is None or r.prefill.done]
        outputs = [o for r in ready for o in self._advance(r, stamp)]
        self.remove([o.job_id for o in outputs if o.ends_job])
        return outputs

    def _prefill_s(self) -> float:
        """The time this step prefills for; a sequence whose prefill it ends is then `done`."""
        if self._prefill is None:
            return 0.0
        pending = [
            (r.prepared, r.prefill)
            for r in self._running.values()
            if r.prefill is not None and not r.prefill.done
        ]
        if not pending:
            return 0.0
        return self._prefill.step_s(pending)

    def _wait_for_tick(self, busy_s: float) -> None:
        """Wait for the next tick, `busy_s` (a prefill) later than it would be."""
        now = time.monotonic()
        due = max(now, self._next_step_at) + busy_s
        if due > now:
            time.sleep(due - now)
        self._next_step_at = due + self._step_s

    def _advance(self, run: _Running, stamp: str) -> list[StepOutput]:
        """One token for each of the job's choices; all of them end at the same step."""
        run.generated += 1
        done = run.generated >= run.prepared.max_tokens
        if self._prefill is not None:
            run.answer.append(stamp)
            if done:
                self._prefill.finished(run.prepared, "".join(run.answer))
        n = len(run.prepared.choices)
        cached = (run.prefill.cached or 0) if run.prefill is not None else 0
        return [
            StepOutput(
                job_id=run.prepared.job_id,
                text=stamp,
                finish_reason="length" if done else None,
                prompt_tokens=run.prepared.prompt_tokens,
                completion_tokens=run.generated * (i + 1),
                cached_tokens=cached,
                index=i,
                choices_left=n - 1 - i if done else n,
            )
            for i in range(n)
        ]

    def remove(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            self._running.pop(job_id, None)
