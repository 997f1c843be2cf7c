"""The API's count of a job's prompt, made once per request before the job is queued.

Workers publish their model's `TokenizerSpec` (shared/queue/prompt/prompt_tokens.py). Per request
the API reads the spec's digest (one small Redis read) and rebuilds the counter only when it
changed. `measure` renders and tokenizes the prompt once; admission (api/queue/admission.py) hands
the count to the context-window check (the rule is shared/queue/prompt/context_window.py's, which
the worker applies too), to the per-key rate limits and to placement. With no spec, or a spec
without a tokenizer, the check is left to the worker, which refuses a prompt that does not fit
before prefill (still a 400 before any stream begins, but after the queue). Rendering and
tokenizing run off the hub (api/http/off_hub.py): a 400,000-character prompt takes about a second.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from redis import Redis

from api.http.off_hub import off_hub
from shared.queue.connection import redis_errors_as_503
from shared.queue.jobs import GenerationJob, QueuedJob
from shared.queue.keys import Keys
from shared.queue.prompt.context_window import completion_budget
from shared.queue.prompt.prompt_tokens import PromptCounter, TokenizerSpec


@dataclass(frozen=True)
class PromptCount:
    """A generation job's prompt as its worker will count it."""

    tokens: int  # for several prompts, the longest one's (each has the window to itself)
    ids: list[int] | None  # the prompt's token ids when the job has one (placement hashes them)
    window: int  # the model's context window

    def room(self, job: GenerationJob) -> int:
        """The tokens the job's completion may generate; a 400 `context_length_exceeded` when
        the prompt does not leave what it asks for."""
        where = "messages" if job.messages is not None else "prompt"
        return completion_budget(
            self.tokens, job.max_tokens, self.window, where, ceiling=job.max_tokens_ceiling
        )


def _count(counter: PromptCounter, job: GenerationJob) -> PromptCount:
    ids = counter.ids(job)
    tokens = len(ids) if ids is not None else counter.count(job)
    return PromptCount(tokens, ids, counter.context_length)


def _counter(raw: bytes | str) -> PromptCounter | None:
    """The counter of a published spec (megabytes of tokenizer JSON to parse)."""
    spec = TokenizerSpec.model_validate_json(raw)
    return PromptCounter(spec) if spec.tokenizer_json is not None else None


class ContextWindows:
    def __init__(self, redis: Redis, keys: Keys):
        self._redis = redis
        self._keys = keys
        self._lock = threading.Lock()
        self._counters: dict[str, tuple[str, PromptCounter | None]] = {}

    def measure(self, job: QueuedJob) -> PromptCount | None:
        """The job's prompt counted once; None for an embedding job (no prompt to fit) or when
        no worker published a tokenizer the API can count with."""
        if not isinstance(job, GenerationJob):
            return None
        with redis_errors_as_503():
            counter = self.counter(job.model)
        if counter is None:
            return None
        return off_hub(_count, counter, job)

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
        return off_hub(_counter, raw)
