"""The engine: a loaded model generating many sequences in one continuous batch.

It knows nothing of Redis or HTTP. Its surface follows mlx-lm's BatchGenerator: `prepare` turns
a job into prompt tokens and limits (worker/engine/prepare.py; it refuses what cannot run), `insert`
queues it for the batch, `step` lets the queued jobs in together and advances every sequence by
one token, returning what each may show now, `remove` drops jobs (cancellation).

A job runs as one sequence per choice (`n`), each a `Sequence` dataclass; the choices of a job
share one prefill of the prompt and each ends on its own, the job when the last one does. What a
step shows of a sequence is made by worker/engine/generation/step_output.py. A
prompt whose opening the prefix cache holds (worker/engine/prefix_cache.py) enters the batch with a
copy of that KV cache and only its remaining tokens to prefill. A prompt that is scored (echo with
logprobs) or that several choices share is computed first, outside the batch
(worker/engine/staged_prompt.py), with what the step's prefill budget leaves after the batch's own
prefill; its choices enter when it is done.
"""

from __future__ import annotations

import copy
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from shared.queue.jobs import GenerationJob
from shared.wire.generation.logprobs import TokenLogprob
from worker.engine.batch.quantized_kv import KVQuantization
from worker.engine.batch.token_batch import kv_form, open_batch, plain_kv
from worker.engine.batch.types import Entry, PrefillBudget
from worker.engine.generation.held_choices import HeldChoices
from worker.engine.generation.step_output import (
    JobInBatch,
    Sequence,
    StepOutput,
    advance,
    failed,
    only_scored,
)
from worker.engine.model import LoadedModel
from worker.engine.prefill_policy import PrefillPolicy
from worker.engine.prefix_cache import PrefixCache, Reuse, level
from worker.engine.prepare import PreparedJob, Preparer
from worker.engine.sequence.detokenize import TextDecoder
from worker.engine.sequence.drafts import DraftFigures, PromptLookup, Speculation
from worker.engine.sequence.logprobs import PromptScorer
from worker.engine.sequence.stop import StopStringMatcher
from worker.engine.staged_prompt import StagedPrompt

log = logging.getLogger(__name__)


class BatchEngine(Protocol):
    """What the engine loop and the job function need from an engine."""

    def prepare(self, job: GenerationJob) -> PreparedJob: ...
    def insert(self, prepared: PreparedJob) -> None: ...
    def step(self) -> list[StepOutput]: ...
    def remove(self, job_ids: list[str]) -> None: ...


@dataclass(frozen=True)
class EngineSettings:
    """How an engine runs its batch: the worker's MLXQ_* settings (worker/runtime/serve.py
    `engine_settings` makes them, for the worker and the benchmarks alike).

    `rows`: sequences in the batch at most; `default_max_tokens`: a request's limit when it sets
    none; `prefill_tokens`: the step's prompt tokens while nothing decodes; `batch`: "slots" or
    "mlx-lm" (worker/engine/batch/token_batch.py); `kv_tokens`: the KV positions the slot
    batch's sequences share, which then refuses longer sequences (None: each row its window);
    `prefill_tokens_decoding`: the step's cap on chunks of prompts that go on while sequences
    decode (None: `prefill_tokens`), and `prefill_seconds_decoding` about the most that prefill
    may take then, at the batch's measured prefill rate (None: no limit in time, and the cap
    holds for whole prompts too); `prefill_burst`: whole short prompts pass that time while
    more interactive sequences wait for a first token than decode
    (worker/engine/prefill_policy.py); `kv_quantization`: the slot batch keeps KV quantized
    (MLXQ_KV_BITS; None: in the model's dtype); `speculation`: each sequence drafts by prompt
    lookup and the slot batch verifies the drafts (None: off); `job_rows`: the most rows one job's
    choices hold at once (worker/engine/generation/held_choices.py; None: `rows`).
    """

    rows: int
    default_max_tokens: int
    prefill_tokens: int
    batch: str
    kv_tokens: int | None = None
    prefill_tokens_decoding: int | None = None
    prefill_seconds_decoding: float | None = None
    prefill_burst: bool = True
    kv_quantization: KVQuantization | None = None
    speculation: Speculation | None = None
    job_rows: int | None = None


class Engine:
    """Continuous batching (worker/engine/batch/token_batch.py), with our stop handling on top."""

    def __init__(
        self, loaded: LoadedModel, settings: EngineSettings, prefixes: PrefixCache | None = None
    ):
        """`loaded`: the model; `settings`: how its batch runs (EngineSettings); `prefixes`: its
        prefix cache (None: none)."""
        s = settings
        batch, kv_tokens, kv_quantization = s.batch, s.kv_tokens, s.kv_quantization
        self._loaded = loaded
        self._prefill = PrefillPolicy(
            s.prefill_tokens,
            s.prefill_tokens_decoding or s.prefill_tokens,
            s.prefill_seconds_decoding,
            s.prefill_burst,
        )
        self._prefixes = prefixes
        self._speculation = s.speculation if batch == "slots" else None
        self.drafts = DraftFigures()  # what the batch checked of its sequences' drafts
        # The KV form of the caches the engine makes: the batch's.
        self._kv_quantization = kv_form(loaded.model, batch, kv_quantization)
        if kv_tokens is not None and (batch != "slots" or plain_kv(loaded.model) is not None):
            log.warning("MLXQ_KV_TOKENS is not applied: this model runs in mlx-lm's batch")
            kv_tokens = None
        window = None if kv_tokens is None else min(kv_tokens, loaded.context_length)
        self._preparer = Preparer(
            loaded, s.default_max_tokens, with_history=prefixes is not None, kv_window=window
        )
        self._batch = open_batch(
            loaded.model,
            s.rows,
            loaded.stop_ids,
            batch,
            keep_caches=prefixes is not None,
            positions=window or loaded.context_length,
            quantization=kv_quantization,
            kv_tokens=kv_tokens,
        )
        self._pending: list[PreparedJob] = []
        self._by_uid: dict[int, Sequence] = {}
        self._jobs: dict[str, JobInBatch] = {}
        self._ready: list[StepOutput] = []  # outputs made at admission (prompts only scored)
        self._rows = s.rows
        self._held = HeldChoices(s.job_rows or s.rows)
        self._staging: deque[StagedPrompt] = deque()  # oldest first
        self._scores: dict[tuple[str, int], list[TokenLogprob] | None] = {}  # scored-only jobs'
        self._interactive: set[int] = set()  # uids of interactive sequences, waiting or running
        self.prefilled_tokens = 0  # prompt tokens computed, for the benchmark

    @property
    def active(self) -> int:
        return len(self._by_uid) + len(self._pending) + len(self._staging)

    def prepare(self, job: GenerationJob) -> PreparedJob:
        return self._preparer.prepare(job)

    def insert(self, prepared: PreparedJob) -> None:
        """Queue the job for the batch; it enters at the next step, with whatever else came."""
        self._pending.append(prepared)

    def _enter_pending(self) -> None:
        """The jobs inserted since the last step: each prompt enters the batch now, or is
        staged first (its choices enter when it is done)."""
        pending, self._pending = self._pending, []
        now: list[tuple[PreparedJob, int]] = []
        starts: list[Reuse] = []
        for p in pending:
            job = self._jobs[p.job_id] = JobInBatch(p.prompt_tokens, 0)
            for k in range(len(p.prompts)):
                start = self._start(p, k)
                job.cached_tokens += start.hits
                staged = self._staged(p, k, start)
                if staged is None:
                    now.append((p, k))
                    starts.append(start)
                    continue
                self._staging.append(staged)
                job.staged += self._choices_of(p, k) if p.max_tokens > 0 else 1
        levelled = level([p.prompts[k] for p, k in now], starts)
        start_of = {(p.job_id, k): r for (p, k), r in zip(now, levelled, strict=True)}
        for p in pending:
            if p.max_tokens == 0 and not self._jobs[p.job_id].staged:  # nothing to score
                self._ready += only_scored(p, self._jobs.pop(p.job_id), {})
        rows = [
            (p, i)
            for p in pending
            if p.max_tokens > 0
            for i, c in enumerate(p.choices)
            if (p.job_id, c.prompt) in start_of
        ]
        if rows:
            self._insert(rows, start_of, {})

    def _start(self, prepared: PreparedJob, k: int) -> Reuse:
        """What the prefix cache holds of the job's prompt k (nothing for a scored prompt:
        the logits of every position are needed)."""
        if self._prefixes is None or prepared.prompt_logprobs is not None:
            return Reuse(None, 0, 0)
        shared = prepared.shared_tokens if k == 0 else 0
        scope, disk = prepared.cache_scope, prepared.keep_on_disk
        return self._prefixes.reuse(prepared.prompts[k], shared, scope, disk)

    def _staged(self, prepared: PreparedJob, k: int, start: Reuse) -> StagedPrompt | None:
        """The job's prompt k as staged work, or None where it enters the batch at once. Staged:
        a prompt that is scored, or that several choices continue (all but its last token is
        computed once, and each choice computes only that)."""
        prompt = prepared.prompts[k]
        if prepared.prompt_logprobs is not None:
            scorer = PromptScorer(prompt, prepared.prompt_logprobs, self._loaded.token_piece)
            return StagedPrompt(prepared, k, start, scorer)
        sharing = self._choices_of(prepared, k) > 1 and prepared.max_tokens > 0
        if sharing and start.tokens < len(prompt) - 1:
            return StagedPrompt(prepared, k, start)
        return None

    @staticmethod
    def _choices_of(prepared: PreparedJob, k: int) -> int:
        return sum(1 for c in prepared.choices if c.prompt == k)

    def _stage(self, tokens: int) -> None:
        """Spend up to `tokens` of the step's prefill on staged prompts, oldest first, while
        the batch has a row for their choices (no more staged KV waits than can enter); the
        choices of a prompt that is done enter the batch."""
        spent = 0
        while self._staging and spent < tokens and len(self._by_uid) < self._rows:
            staged = self._staging[0]
            spent += staged.advance(self._loaded.model, self._kv_quantization, tokens - spent)
            if staged.left == 0:
                self._staging.popleft()
                self._staged_done(staged)
        self.prefilled_tokens += spent

    def _staged_done(self, staged: StagedPrompt) -> None:
        p, key = staged.job, (staged.job.job_id, staged.k)
        job = self._jobs[p.job_id]
        if p.max_tokens == 0:  # only scored: the job ends with its last prompt
            job.staged -= 1
            self._scores[key] = staged.logprobs
            if not job.staged:
                keys = [(p.job_id, k) for k in range(len(p.prompts))]
                logprobs = {k: self._scores.pop(k, None) for k in keys}
                self._ready += only_scored(p, self._jobs.pop(p.job_id), logprobs)
            return
        rows = [(p, i) for i, c in enumerate(p.choices) if c.prompt == staged.k]
        job.staged -= len(rows)
        self._insert(rows, {key: staged.done}, {key: staged.logprobs})

    def _insert(
        self,
        rows: list[tuple[PreparedJob, int]],
        start_of: dict[tuple[str, int], Reuse],
        scored: dict[tuple[str, int], list[TokenLogprob] | None],
    ) -> None:
        running = {p.job_id: len(self._jobs[p.job_id].uids) for p, _ in rows}
        rows, held = self._held.admit(rows, running, start_of, scored)
        for p, _ in held:  # a held choice keeps its job open, as a staged one does
            self._jobs[p.job_id].staged += 1
        if rows:
            self._enter(rows, start_of, scored)

    def _enter(
        self,
        rows: list[tuple[PreparedJob, int]],
        start_of: dict[tuple[str, int], Reuse],
        scored: dict[tuple[str, int], list[TokenLogprob] | None],
    ) -> None:
        """The rows into the batch, each a sequence of its own."""
        keys = [(p.job_id, p.choices[i].prompt) for p, i in rows]
        # Each choice gets a cache of its own, copied before the batch takes any of them.
        caches = [
            start_of[key].cache if keys.index(key) == n else copy.deepcopy(start_of[key].cache)
            for n, key in enumerate(keys)
        ]
        prompts = [p.prompts[p.choices[i].prompt] for p, i in rows]
        begin = [start_of[key].tokens for key in keys]
        drafters = [self._drafter(p) for p, _ in rows]
        uids = self._batch.insert(
            [
                Entry(
                    prompt=prompt[b:],
                    cached=prompt[:b],
                    cache=cache,
                    max_tokens=p.max_tokens,
                    sampler=p.choices[i].sampler,
                    processors=list(p.choices[i].processors),
                    drafter=drafter,
                )
                for prompt, b, cache, (p, i), drafter in zip(
                    prompts, begin, caches, rows, drafters, strict=True
                )
            ]
        )
        self.prefilled_tokens += sum(len(t) - b for t, b in zip(prompts, begin, strict=True))
        for uid, (prepared, i), key, drafter in zip(uids, rows, keys, drafters, strict=True):
            choice = prepared.choices[i]
            self._by_uid[uid] = Sequence(
                job_id=prepared.job_id,
                index=i,
                decoder=self._new_decoder(prepared),
                matcher=StopStringMatcher(prepared.stops),
                recorder=choice.recorder,
                calls=choice.calls,
                split=choice.split,
                opening=scored.get(key),
                scope=prepared.cache_scope,
                keep_on_disk=prepared.keep_on_disk,
                drafter=drafter,
            )
            self._jobs[prepared.job_id].uids.append(uid)
            if prepared.interactive:
                self._interactive.add(uid)

    def _drafter(self, prepared: PreparedJob) -> PromptLookup | None:
        if self._speculation is None:
            return None
        return PromptLookup(self._speculation, list(prepared.predicted), self.drafts)

    def _new_decoder(self, prepared: PreparedJob) -> TextDecoder:
        return self._loaded.new_decoder()

    def step(self) -> list[StepOutput]:
        """Advance every sequence by one token (prompts by one chunk, staged prompts by what the
        step's budget leaves)."""
        self._enter_pending()
        outputs: list[StepOutput] = []
        budget = self._budget()
        generated = self._batch.next(budget)
        finished: list[tuple[list[int], list[Any], Sequence]] = []  # caches to keep
        for r in generated:
            sequence = self._by_uid.get(r.uid)
            if sequence is None:  # its job ended earlier in this step
                continue
            if r.prompt_cache is not None and r.all_tokens is not None:
                finished.append((r.all_tokens, r.prompt_cache, sequence))
            out = self._advance_one(r.uid, r.token, r.finish_reason)
            outputs.append(out)
            if out.ends_job:
                self.remove([out.job_id])
            elif out.finish_reason is not None:
                self._drop([r.uid])
        self._release_held()  # after the ends above: rows they freed
        self._stage(self._staging_tokens(budget))
        outputs, self._ready = self._ready + outputs, []
        if self._prefixes is not None:
            for tokens, cache, sequence in finished:
                self._prefixes.store(tokens, cache, sequence.scope, sequence.keep_on_disk)
        return outputs

    def _release_held(self) -> None:
        """Held choices enter for the rows their jobs' ended choices left; they start
        prefilling in the next step."""
        if not self._held:
            return
        for job_id in self._held.jobs():
            job = self._jobs.get(job_id)
            if job is None:
                continue
            room = self._held.share - len(job.uids)
            if room <= 0:
                continue
            entering = self._held.release(job_id, room)
            job.staged -= len(entering.rows)
            self._enter(entering.rows, entering.starts, entering.scored)

    def _budget(self) -> PrefillBudget:
        """What this step may prefill (worker/engine/prefill_policy.py). Bulk work alone is
        prefilled as if nothing decoded: in groups as large as the batch allows, since nobody
        waits on a first token and each group's fixed cost is paid once (measured: commit
        54a7b4d), but no more a step than a step with nothing decoding takes, so that no step
        holds the engine for all of it (the watchdog reads a long step as a wedged worker)."""
        decoding = self._batch.decoding
        if not self._interactive and not any(s.job.interactive for s in self._staging):
            decoding = False
        return self._prefill.budget(decoding, self._batch.prefill_rate, self._bursting)

    def _staging_tokens(self, budget: PrefillBudget) -> int:
        """What the step's budget leaves staged prompts after the batch's own prefill: they are
        chunks of long prompts, under the cap on those."""
        return max(0, min(budget.tokens, budget.partial) - self._batch.prefilled)

    def _bursting(self) -> bool:
        """More interactive sequences wait for their first token than stream their next."""
        starting = streaming = 0
        for job in self._jobs.values():
            if job.uids and job.uids[0] in self._interactive:
                if job.completion_tokens:
                    streaming += len(job.uids)
                else:
                    starting += len(job.uids)
        return starting > streaming

    def _advance_one(self, uid: int, token: int, finish_reason: str | None) -> StepOutput:
        """One sequence's share of a step: if it fails, its job ends, not the batch."""
        seq = self._by_uid[uid]
        job = self._jobs[seq.job_id]
        try:
            return advance(seq, job, token, finish_reason, self._loaded.stop_ids)
        except Exception as err:
            return failed(seq, job, err)

    def remove(self, job_ids: list[str]) -> None:
        self._pending = [p for p in self._pending if p.job_id not in job_ids]
        self._staging = deque(s for s in self._staging if s.job.job_id not in job_ids)
        self._scores = {k: v for k, v in self._scores.items() if k[0] not in job_ids}
        self._held.drop(job_ids)
        for job_id in job_ids:
            job = self._jobs.pop(job_id, None)
            if job is not None:
                self._drop(job.uids)

    def _drop(self, uids: list[int]) -> None:
        """Take sequences out of the batch (mlx-lm's own retired ones are simply not found)."""
        uids = [u for u in uids if u in self._by_uid]
        if not uids:
            return
        self._batch.remove(uids)
        self._interactive.difference_update(uids)
        for uid in uids:
            seq = self._by_uid.pop(uid)
            job = self._jobs.get(seq.job_id)
            if job is not None and uid in job.uids:
                job.uids.remove(uid)
