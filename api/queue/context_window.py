"""The context-window check the API makes before a job is queued.

Workers publish their model's `TokenizerSpec` (shared/queue/prompt_tokens.py). Per request the API
reads the spec's digest (one small Redis read) and rebuilds the counter only when it changed.
The rule itself is shared/queue/context_window.py's, which the worker applies too. With no spec, or
a spec without a tokenizer, the check is left to the worker, which refuses a prompt that does
not fit before prefill (still a 400 before any stream begins, but after the queue).
"""

from __future__ import annotations

import threading

from redis import Redis

from shared.queue.context_window import completion_budget
from shared.queue.jobs import GenerationJob
from shared.queue.keys import Keys
from shared.queue.prompt_tokens import PromptCounter, TokenizerSpec


class ContextWindows:
    def __init__(self, redis: Redis, keys: Keys):
        self._redis = redis
        self._keys = keys
        self._lock = threading.Lock()
        self._counters: dict[str, tuple[str, PromptCounter | None]] = {}

    def check(self, job: GenerationJob) -> list[int] | None:
        """Refuse a prompt that does not fit; return its token ids when the job has one prompt
        and the API can count it (placement hashes them: api/queue/placement.py)."""
        counter = self.counter(job.model)
        if counter is None:
            return None
        ids = counter.ids(job)
        count = len(ids) if ids is not None else counter.count(job)
        where = "messages" if job.messages is not None else "prompt"
        completion_budget(
            count, job.max_tokens, counter.context_length, where, ceiling=job.max_tokens_ceiling
        )
        return ids

    def count(self, job: GenerationJob) -> int | None:
        """The job's prompt tokens as its worker will count them; None if no worker published
        a tokenizer the API can count with."""
        counter = self.counter(job.model)
        return None if counter is None else counter.count(job)

    def counter(self, model: str) -> PromptCounter | None:
        """The model's prompt counter, as its workers published it; None: none published."""
        key = self._keys.tokenizer(model)
        raw_digest = self._redis.hget(key, "digest")
        if raw_digest is None:
            return None
        digest = raw_digest.decode() if isinstance(raw_digest, bytes) else str(raw_digest)
        cached = self._counters.get(model)
        if cached is not None and cached[0] == digest:
            return cached[1]
        with self._lock:  # one rebuild per new spec, not one per waiting request
            cached = self._counters.get(model)
            if cached is None or cached[0] != digest:
                cached = (digest, self._load(key))
                self._counters[model] = cached
        return cached[1]

    def _load(self, key: str) -> PromptCounter | None:
        raw = self._redis.hget(key, "spec")
        if raw is None:
            return None
        spec = TokenizerSpec.model_validate_json(raw)
        return PromptCounter(spec) if spec.tokenizer_json is not None else None
