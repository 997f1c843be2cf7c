"""The jobs the API puts on a model's RQ queue and the worker reads back.

RQ carries a job as plain JSON (RQ's JSON serializer), as the single argument of the job
function that runs its kind. What differs between kinds is said by each kind's class, in one
place (its class variables and `prompt_estimate`), never by a test of its type where it is used:
the job function, the kind of model that runs it, its operation's name. Every kind extends
`QueuedJobBase`: its id and model, its place in the queue (lane, fair share, priority), its
limits, the queued tokens it holds, who waits on its events (`reply_to`) and its trace. Its time
limits travel with it (`JobLimits`), so each producer sets its own: an interactive request gives
up after seconds, a batch line may wait for hours.

A generation job (`GenerationJob`, run by `JOB_FUNCTION`) has exactly one of `messages` (chat)
and `prompt` (text completion). A stored response sets `replay_ttl_s` (its event log is its
record); a batch line sets `batch_line` (the worker records its answer in the batch). An
embedding job (`EmbeddingJob`, run by `EMBEDDING_JOB_FUNCTION` on a worker that serves an
embedding model) carries its inputs, already split into a list.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.queue import fair_order
from shared.queue.prefix.cache_scope import SCOPE_PATTERN, UNSCOPED, hint, narrowed
from shared.wire.anthropic.messages import MessagesInput
from shared.wire.batch.batches import BatchLine
from shared.wire.chat.completions import ChatCompletionRequest, ChatMessage, CompletionRequest
from shared.wire.embeddings import MAX_INPUTS, EmbeddingRequest
from shared.wire.fleet.catalog import ModelKind
from shared.wire.generation.reasoning import ReasoningControl
from shared.wire.generation.sampling import SamplingParams
from shared.wire.generation.tools import ToolUse
from shared.wire.ids import ID_PATTERN, MODEL_NAME_PATTERN
from shared.wire.images import ImageRef
from shared.wire.responses.responses import ResponsesRequest

# Where a job waits, in the order workers take: a client waiting on it; a background response
# (or a request with `service_tier: flex`); a batch line.
Lane = Literal["interactive", "background", "batch"]
LANES: tuple[Lane, ...] = ("interactive", "background", "batch")

JOB_FUNCTION = "worker.runtime.job_function.run_generation"
EMBEDDING_JOB_FUNCTION = "worker.runtime.job_function.run_embedding"


class JobLimits(BaseModel):
    """When a job gives up; None means no limit."""

    model_config = ConfigDict(frozen=True)
    # Unix time after which the job must not start: a worker that takes it later fails it.
    queue_deadline: float | None = None
    # Seconds the job may run once started; then a generation ends as `on_run_limit` says (an
    # embedding job, whose vectors are all or nothing, ends in an error).
    run_limit_s: Annotated[float, Field(gt=0)] | None = None
    on_run_limit: Literal["length", "error"] = "length"


class QueuedJobBase(BaseModel):
    """What every job on a model's queue carries, whatever its kind: its place in the queue,
    its limits and who waits on it. Frozen: a job is built whole (`job_for`), copied with what
    admission adds (api/queue/admission.py), and never changed after."""

    model_config = ConfigDict(frozen=True)

    # The kind: the job function that runs it, and the kind of model that can.
    function: ClassVar[str]
    model_kind: ClassVar[ModelKind]

    job_id: Annotated[str, Field(pattern=ID_PATTERN)]
    model: Annotated[str, Field(pattern=MODEL_NAME_PATTERN)]
    limits: JobLimits = JobLimits()
    # Who sent it: the hashed id of its API key (api/http/auth.py), for the job's log line and
    # record.
    owner: Annotated[str, Field(pattern=ID_PATTERN)] | None = None
    # Its place among the model's interactive jobs (shared/queue/fair_order.py): whose turn,
    # priority.
    share: str | None = None
    priority: int = 0
    lane: Lane = "interactive"
    # The tokens it holds of its key's queued-token limit until it ends
    # (shared/queue/queued_tokens.py); None: its key has no such limit.
    queued_tokens: int | None = None
    # The API process waiting on its events (their channel is keys.py `reply`); None: nobody
    # waits live, and they go on the job's own channel.
    reply_to: Annotated[str, Field(pattern=ID_PATTERN)] | None = None
    # The W3C traceparent of the API's span for the request, when tracing is on
    # (shared/observe/tracing.py).
    trace: str | None = None
    # Ollama's keep_alive from the request, in seconds (shared/wire/fleet/keep_alive.py): how long
    # its model stays loaded once idle after it; None: the model's own keep-alive (worker/pool/).
    keep_alive_s: float | None = None
    # Set for a batch's line: the worker records its answer in the batch.
    batch_line: BatchLine | None = None

    @property
    def replayed(self) -> bool:
        """Whether its events are also kept in a replay log, for a reader that comes later."""
        return False

    @property
    def operation(self) -> str:
        """What it does, in OpenTelemetry's GenAI names (shared/observe/tracing.py)."""
        raise NotImplementedError

    def prompt_estimate(self) -> int:
        """Its prompt tokens, estimated from its text alone (for the token cap, before or
        without a tokenizer: shared/queue/backlog.py)."""
        raise NotImplementedError


class GenerationJob(QueuedJobBase):
    """A chat or text completion to generate, with everything that shapes its output."""

    function: ClassVar[str] = JOB_FUNCTION
    model_kind: ClassVar[ModelKind] = "chat"

    messages: list[ChatMessage] | None = None
    # One text, or several prompts (texts or token ids), each with its own n choices.
    prompt: str | list[str | list[int]] | None = None
    # None means "up to the context window"; 0 (a text completion with echo) scores the prompt.
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    # Set for Anthropic's messages, whose max_tokens is a ceiling: a prompt that leaves less room
    # generates what fits (ending "length") instead of being refused
    # (shared/queue/prompt/context_window.py).
    max_tokens_ceiling: bool = False
    sampling: SamplingParams = SamplingParams()
    stop: Annotated[list[str], Field(max_length=4)] = []
    n: Annotated[int, Field(ge=1, le=128)] = 1  # choices per prompt, each its own sequence
    # Set for an echoed text completion with logprobs: the prompt tokens' logprobs, k alternatives.
    prompt_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    # An llguidance grammar (shared/wire/generation/grammar.py) the output must match; None: free
    # text.
    grammar: str | None = None
    # Set when a chat request gave tools: how they are rendered, parsed and maybe forced.
    tools: ToolUse | None = None
    # How a reasoning model may think (shared/wire/generation/reasoning.py); None: its template's
    # default.
    reasoning: ReasoningControl | None = None
    # Passed to the chat template as they are (vLLM's and mlx_lm.server's `chat_template_kwargs`).
    chat_template_kwargs: dict[str, Any] | None = None
    # None: no log probabilities; k: each token's logprob and its k most likely alternatives.
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    # Keep the job's event log this long once it ends (instead of the worker's default).
    replay_ttl_s: Annotated[int, Field(ge=1)] | None = None
    # Whose prefix cache entries it may reuse and adds to (shared/queue/prefix/cache_scope.py).
    cache_scope: Annotated[str, Field(pattern=SCOPE_PATTERN)] = UNSCOPED
    # Its `prompt_cache_key` as a placement hint under that scope (cache_scope.py `hint`); None:
    # none given. Only the API reads it (api/queue/placement.py).
    cache_hint: Annotated[str, Field(pattern=SCOPE_PATTERN)] | None = None
    # False for a request that said `store: false`: what it adds to the prefix cache stays in
    # memory, never in the disk tier's files.
    keep_on_disk: bool = True
    # OpenAI's predicted output: text the answer is expected to repeat, a draft source where the
    # worker speculates (worker/engine/sequence/drafts.py).
    prediction: str | None = None
    # The messages' images, checked (shared/wire/images.py), in the order of their parts: each
    # with its content id, the key of its positions in the prefix cache. A job with images runs
    # only on a model that reads them (shared/queue/model_kinds.py).
    images: list[ImageRef] = []

    @property
    def replayed(self) -> bool:
        """Whether its events are also kept in a replay log: only for a job that is read back
        later (a stored response, a batch line). A plain request's API process listens on its
        reply channel before the job is queued, so it misses nothing without one."""
        return self.replay_ttl_s is not None or self.batch_line is not None

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerationJob:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("a job has exactly one of messages and prompt")
        return self

    @property
    def has_images(self) -> bool:
        """Whether its messages carry images (checked or not: a batch line's are not)."""
        return any(m.image_parts() for m in self.messages or [])

    def prompt_items(self) -> list[str | list[int]]:
        """A text completion's prompts, one item each ([] for a chat job)."""
        if self.prompt is None:
            return []
        return [self.prompt] if isinstance(self.prompt, str) else self.prompt

    def choices(self) -> int:
        return self.n * max(1, len(self.prompt_items()))

    @property
    def operation(self) -> str:
        return "chat" if self.messages is not None else "text_completion"

    def prompt_estimate(self) -> int:
        if self.messages is not None:
            return sum(text_tokens(m.text()) + PER_MESSAGE_TOKENS for m in self.messages)
        items = self.prompt_items()
        return sum(text_tokens(i) if isinstance(i, str) else len(i) for i in items)


class EmbeddingJob(QueuedJobBase):
    """A request's inputs to embed, one vector each. It keeps no replay log: only a client
    waiting on the request reads its vectors."""

    function: ClassVar[str] = EMBEDDING_JOB_FUNCTION
    model_kind: ClassVar[ModelKind] = "embedding"

    inputs: Annotated[list[str | list[int]], Field(min_length=1, max_length=MAX_INPUTS)]

    @property
    def operation(self) -> str:
        return "embeddings"

    def prompt_estimate(self) -> int:
        return sum(text_tokens(i) if isinstance(i, str) else len(i) for i in self.inputs)


# Whatever a model's queue carries.
QueuedJob = GenerationJob | EmbeddingJob
# A message's template framing, in tokens, where a prompt is estimated.
PER_MESSAGE_TOKENS = 4


def text_tokens(text: str) -> int:
    """A text's tokens, estimated from its bytes (about 4 each in English)."""
    return max(1, -(-len(text.encode()) // 4))


def embedding_job_for(job_id: str, req: EmbeddingRequest, owner: str | None) -> EmbeddingJob:
    """The embedding job that answers a validated embeddings request."""
    share = fair_order.share(owner, req.user, keyed=owner not in (None, "anonymous"))
    return EmbeddingJob(
        job_id=job_id,
        model=req.model,
        inputs=req.inputs(),
        owner=owner,
        share=share,
        priority=req.priority,
        keep_alive_s=req.keep_alive,
    )


class JobOutcome(BaseModel):
    """What the job function returns to RQ (stored as the job's result)."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    first_token_at: float | None = None  # unix s; None: it produced no token
    error: str | None = None  # why it failed (finish_reason "error"), as its client was told


class _Queueing(TypedDict):
    """Who sent a generation job, where it waits and how long its events are kept."""

    owner: str | None
    share: str
    priority: int
    lane: Lane
    replay_ttl_s: int | None
    keep_alive_s: float | None
    cache_scope: str
    cache_hint: str | None
    keep_on_disk: bool


def job_for(
    job_id: str,
    req: ChatCompletionRequest | CompletionRequest | ResponsesRequest | MessagesInput,
    owner: str | None = None,
    replay_ttl_s: int | None = None,
    scope: str = UNSCOPED,
    images: list[ImageRef] | None = None,
) -> GenerationJob:
    """The generation job that answers a validated request of any of the four endpoints. A
    message is a chat request inside, with Anthropic's thinking and its max_tokens a ceiling.
    `replay_ttl_s`: keep the job's event log that long (a stored response); `scope`: its
    sender's cache scope (api/http/auth.py), which the request's `cache_salt` narrows;
    `images`: the request's images as checked (shared/wire/images.py `check_images`)."""
    if isinstance(req, MessagesInput):
        chat = job_for(job_id, req.chat_request(), owner, replay_ttl_s, scope, images)
        update = {"reasoning": req.reasoning_control(), "max_tokens_ceiling": True}
        return chat.model_copy(update=update)  # built, not yet admitted
    lane: Lane = "interactive"
    if isinstance(req, ResponsesRequest) and req.background:
        lane = "background"
    if isinstance(req, ChatCompletionRequest) and req.service_tier == "flex":
        lane = "background"
    scoped = narrowed(scope, None if isinstance(req, ResponsesRequest) else req.cache_salt)
    key = None if isinstance(req, CompletionRequest) else req.prompt_cache_key
    queueing = _Queueing(
        owner=owner,
        share=fair_order.share(owner, req.user, keyed=owner not in (None, "anonymous")),
        priority=0 if isinstance(req, ResponsesRequest) else req.priority,
        lane=lane,
        replay_ttl_s=replay_ttl_s,
        keep_alive_s=None if isinstance(req, ResponsesRequest) else req.keep_alive,
        cache_scope=scoped,
        cache_hint=hint(scoped, key),
        keep_on_disk=isinstance(req, CompletionRequest) or req.store is not False,
    )
    job = _job_for(job_id, req, queueing)
    return job.model_copy(update={"images": images}) if images else job


def _job_for(
    job_id: str,
    req: ChatCompletionRequest | CompletionRequest | ResponsesRequest,
    queueing: _Queueing,
) -> GenerationJob:
    if isinstance(req, ResponsesRequest):
        return GenerationJob(
            job_id=job_id,
            model=req.model,
            messages=req.chat_messages(),
            max_tokens=req.max_output_tokens,
            sampling=SamplingParams(temperature=req.temperature, top_p=req.top_p),
            grammar=req.grammar(),
            tools=req.tool_use(),
            reasoning=req.reasoning_control(),
            **queueing,
        )
    if isinstance(req, ChatCompletionRequest):
        return GenerationJob(
            job_id=job_id,
            model=req.model,
            messages=req.messages,
            max_tokens=req.token_limit(),
            sampling=req.sampling(),
            stop=req.stop_strings(),
            grammar=req.response_format.grammar("response_format") if req.response_format else None,
            logprobs=req.logprob_alternatives(),
            tools=req.tool_use(),
            reasoning=req.reasoning_control(),
            chat_template_kwargs=req.chat_template_kwargs,
            n=req.n,
            prediction=req.prediction.text() if req.prediction else None,
            **queueing,
        )
    return GenerationJob(
        job_id=job_id,
        model=req.model,
        prompt=req.prompt if isinstance(req.prompt, str) else req.prompts(),
        max_tokens=req.max_tokens,
        sampling=req.sampling(),
        stop=req.stop_strings(),
        logprobs=req.logprobs,
        n=req.n,
        prompt_logprobs=req.logprobs if req.echo else None,
        **queueing,
    )
