"""The embedding engine: the inputs of many jobs encoded together in padded forwards.

It knows nothing of Redis or HTTP and has the generation engine's shape: `prepare` tokenizes a
job's inputs and refuses one the model cannot take (more tokens than its positions, a token id
outside its vocabulary) before the job is admitted; `insert` queues its inputs; `step` encodes
the next group of queued inputs, whatever jobs they come from, in one padded forward and
returns their vectors; `remove` drops jobs (cancellation). A group holds at most `max_inputs`
inputs and `max_tokens` padded tokens. A job's inputs are queued shortest first, so that the
inputs of a group are of similar lengths and little of a forward is padding; each vector keeps
its input's index.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from shared.queue.jobs import EmbeddingJob
from shared.wire.errors import InvalidRequestError
from worker.engine.embedding.encoder import Encoder

# Padded tokens in one forward: 64 inputs of 128 tokens, or 16 of the longest (512).
MAX_BATCH_TOKENS = 8192


@dataclass(frozen=True)
class PreparedEmbedding:
    job_id: str
    inputs: list[list[int]]  # each input's token ids, [CLS] and [SEP] included

    @property
    def prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.inputs)

    @property
    def reasons(self) -> bool:
        return False  # vectors, not text


@dataclass(frozen=True)
class Pending:
    job_id: str
    index: int
    ids: list[int]


@dataclass(frozen=True)
class EmbeddingOutput:
    """One input's vector (little-endian float32 bytes); `ends_job` on its job's last one."""

    job_id: str
    index: int
    vector: bytes
    ends_job: bool
    prompt_tokens: int  # the job's, all inputs together


class EmbeddingEngine:
    def __init__(self, encoder: Encoder, max_inputs: int, max_tokens: int = MAX_BATCH_TOKENS):
        self.encoder = encoder
        self.max_inputs = max_inputs
        self.max_tokens = max(max_tokens, encoder.max_tokens)
        self._queue: deque[Pending] = deque()
        self._left: dict[str, int] = {}  # job id -> inputs not yet encoded
        self._tokens: dict[str, int] = {}  # job id -> its prompt tokens

    def prepare(self, job: EmbeddingJob) -> PreparedEmbedding:
        texts = [(i, item) for i, item in enumerate(job.inputs) if isinstance(item, str)]
        tokenized = self.encoder.tokenize([t for _, t in texts])
        encoded = dict(zip([i for i, _ in texts], tokenized, strict=True))
        inputs = [
            encoded[i] if isinstance(item, str) else self._checked_ids(item, i, len(job.inputs))
            for i, item in enumerate(job.inputs)
        ]
        for i, ids in enumerate(inputs):
            if len(ids) > self.encoder.max_tokens:
                raise InvalidRequestError(
                    f"{_which(i, len(inputs))} is {len(ids)} tokens long; this model's maximum "
                    f"input length is {self.encoder.max_tokens} tokens. Please reduce the "
                    "length of the input.",
                    param="input",
                    code="context_length_exceeded",
                )
        return PreparedEmbedding(job.job_id, inputs)

    def _checked_ids(self, ids: list[int], index: int, count: int) -> list[int]:
        vocab = self.encoder.bert.embeddings.word_embeddings.weight.shape[0]
        bad = next((t for t in ids if t >= vocab), None)
        if bad is not None:
            raise InvalidRequestError(
                f"{_which(index, count)} holds the token id {bad}, outside this model's "
                f"vocabulary (ids 0 to {vocab - 1}).",
                param="input",
            )
        return self.encoder.framed(ids)

    def insert(self, prepared: PreparedEmbedding) -> None:
        order = sorted(range(len(prepared.inputs)), key=lambda i: len(prepared.inputs[i]))
        self._queue.extend(Pending(prepared.job_id, i, prepared.inputs[i]) for i in order)
        self._left[prepared.job_id] = len(prepared.inputs)
        self._tokens[prepared.job_id] = prepared.prompt_tokens

    def remove(self, job_ids: list[str]) -> None:
        gone = set(job_ids)
        self._queue = deque(p for p in self._queue if p.job_id not in gone)
        for job_id in gone:
            self._left.pop(job_id, None)
            self._tokens.pop(job_id, None)

    @property
    def queued(self) -> int:
        """Inputs waiting to be encoded."""
        return len(self._queue)

    def step(self) -> list[EmbeddingOutput]:
        """Encode the next group of queued inputs; [] when none wait."""
        group = self._next_group()
        if not group:
            return []
        vectors = np.asarray(self.encoder.embed([p.ids for p in group]), dtype="<f4")
        outputs = []
        for pending, vector in zip(group, vectors, strict=True):
            self._left[pending.job_id] -= 1
            ends = self._left[pending.job_id] == 0
            tokens = self._tokens[pending.job_id]
            if ends:
                self.remove([pending.job_id])
            outputs.append(
                EmbeddingOutput(pending.job_id, pending.index, vector.tobytes(), ends, tokens)
            )
        return outputs

    def _next_group(self) -> list[Pending]:
        group: list[Pending] = []
        width = 0
        while self._queue and len(group) < self.max_inputs:
            wider = max(width, len(self._queue[0].ids))
            if group and wider * (len(group) + 1) > self.max_tokens:
                break
            group.append(self._queue.popleft())
            width = wider
        return group


def _which(index: int, count: int) -> str:
    return "The input" if count == 1 else f"Input {index}"


def warm_up(engine: EmbeddingEngine) -> None:
    """One small forward, so the first request does not pay for MLX's first-call setup."""
    mx.eval(engine.encoder.embed([engine.encoder.framed([])]))
