"""A running job and its sequences, and what each step shows of them.

A job in the batch (`JobInBatch`) counts its usage for all its choices; each choice runs as one
`Sequence`, which holds its per-sequence features (worker/engine/sequence/). What a step shows of
one sequence is a `StepOutput`, made here: by `advance` from the token the batch gave it (its
text past the detokenizer, a reasoning model's split, stop strings and tool calls, its logprobs,
the job's counts), by `failed` for a sequence whose own work raised (its job ends, not the
batch), and by `only_scored` for a job that only scores its prompts. The engine
(worker/engine/generation/engine.py) calls `advance` once per token of each sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.wire.generation.logprobs import TokenLogprob
from shared.wire.generation.tools import ToolCall, ToolCallDelta
from worker.engine.prepare import PreparedJob
from worker.engine.sequence.calls.tool_calls import Scanned, ToolCallScanner
from worker.engine.sequence.detokenize import TextDecoder
from worker.engine.sequence.drafts import PromptLookup
from worker.engine.sequence.logprobs import LogprobRecorder
from worker.engine.sequence.reasoning import Split
from worker.engine.sequence.stop import StopStringMatcher


@dataclass
class Sequence:
    """One choice of a running job."""

    job_id: str
    index: int
    decoder: TextDecoder
    matcher: StopStringMatcher
    recorder: LogprobRecorder | None
    calls: ToolCallScanner | None
    split: Split | None  # a reasoning model's: its reasoning apart from its content
    # The prompt's own logprobs (an echo that asked for them), sent with the first token.
    opening: list[TokenLogprob] | None = None
    # Its job's cache scope, and whether its cache may go to disk (PreparedJob's).
    scope: str = ""
    keep_on_disk: bool = True
    drafter: PromptLookup | None = None  # set when it speculates


@dataclass
class JobInBatch:
    """A job in the batch: what its usage counts, and its choices still running."""

    prompt_tokens: int
    cached_tokens: int
    uids: list[int] = field(default_factory=list)
    # Choices whose prompt is still staged (a job that only scores: its prompts still staged).
    staged: int = 0
    completion_tokens: int = 0  # all choices together
    reasoning_tokens: int = 0  # of those, the ones spent reasoning
    # Drafted tokens of its prediction kept and not (all choices).
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


@dataclass(frozen=True)
class StepOutput:
    """What one step produced for one choice: new visible text, and why it ended if it did.

    The job has ended when a choice ends with `choices_left` 0. Token counts are the job's (all
    choices). A choice whose own work failed ends its whole job with finish_reason "error" and
    the reason in `error`.
    """

    job_id: str
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None
    call_deltas: list[ToolCallDelta] | None = None
    tool_calls: list[ToolCall] | None = None
    index: int = 0
    choices_left: int = 0
    stop_sequence: str | None = None  # the stop string that ended the choice, if one did
    reasoning: str = ""  # new reasoning text (a reasoning model's thinking, apart from `text`)
    reasoning_tokens: int = 0  # the job's completion tokens spent reasoning (all choices)
    accepted_prediction_tokens: int = 0  # the job's (all choices)
    rejected_prediction_tokens: int = 0

    @property
    def ends_job(self) -> bool:
        return self.finish_reason is not None and self.choices_left == 0


def advance(
    seq: Sequence, job: JobInBatch, token: int, finish_reason: str | None, stops: frozenset[int]
) -> StepOutput:
    """One token of `seq` (of `job`), and why the sequence ended if it did (the batch's reason,
    or a stop string's): its text, reasoning, tool calls and logprobs; `stops`: the model's stop
    tokens, which show no text."""
    job.completion_tokens += 1
    text = ""
    logprobs = None
    if seq.recorder is not None:
        entry = seq.recorder.take()
        logprobs = [] if token in stops else [entry]
    if seq.opening is not None:
        logprobs, seq.opening = seq.opening + (logprobs or []), None
    reasoning = ""
    if token not in stops:
        piece = seq.decoder.add(token)
        if seq.split is not None:
            piece, reasoning = _split(seq.split, job, token, piece)
        text = seq.matcher.feed(piece)
    if seq.matcher.matched:
        finish_reason = "stop"
    elif finish_reason is not None:
        rest = seq.decoder.finish()
        if seq.split is not None:
            rest, held = seq.split.finish(rest)
            reasoning += held
        text += seq.matcher.feed(rest) + seq.matcher.flush()
        finish_reason = "stop" if seq.matcher.matched else finish_reason
    deltas = calls = None
    if seq.calls is not None:
        scanned = _scan(seq.calls, text, finish_reason is not None)
        text, deltas, calls = scanned.text, scanned.deltas or None, scanned.calls or None
        if seq.calls.made and finish_reason == "stop":
            finish_reason = "tool_calls"
    _count_prediction(seq.drafter, job)
    left = len(job.uids) + job.staged - (finish_reason is not None)
    return StepOutput(
        job_id=seq.job_id,
        text=text,
        finish_reason=finish_reason,
        prompt_tokens=job.prompt_tokens,
        completion_tokens=job.completion_tokens,
        cached_tokens=job.cached_tokens,
        logprobs=logprobs,
        call_deltas=deltas,
        tool_calls=calls,
        index=seq.index,
        choices_left=left,
        stop_sequence=seq.matcher.matched_stop if finish_reason == "stop" else None,
        reasoning=reasoning,
        reasoning_tokens=job.reasoning_tokens,
        accepted_prediction_tokens=job.accepted_prediction_tokens,
        rejected_prediction_tokens=job.rejected_prediction_tokens,
    )


def _count_prediction(drafter: PromptLookup | None, job: JobInBatch) -> None:
    """The job counts what the batch checked of its prediction since the last token."""
    if drafter is None:
        return
    job.accepted_prediction_tokens += drafter.predicted_kept
    job.rejected_prediction_tokens += drafter.predicted_rejected
    drafter.predicted_kept = drafter.predicted_rejected = 0


def _split(split: Split, job: JobInBatch, token: int, piece: str) -> tuple[str, str]:
    """`piece` as content and reasoning; the job counts the reasoning tokens."""
    before = split.reasoning_tokens
    content, reasoning = split.feed(token, piece)
    job.reasoning_tokens += split.reasoning_tokens - before
    return content, reasoning


def _scan(scanner: ToolCallScanner, text: str, last: bool) -> Scanned:
    got = scanner.feed(text)
    if last:
        rest = scanner.finish()
        got.text += rest.text
        got.deltas += rest.deltas
        got.calls += rest.calls
    return got


def failed(seq: Sequence, job: JobInBatch, err: Exception) -> StepOutput:
    """`seq`'s end when its own work raised `err`: its job ends, with the reason."""
    return StepOutput(
        job_id=seq.job_id,
        text="",
        finish_reason="error",
        prompt_tokens=job.prompt_tokens,
        completion_tokens=job.completion_tokens,
        cached_tokens=job.cached_tokens,
        error=f"{type(err).__name__}: {err}",
        index=seq.index,
    )


def only_scored(
    prepared: PreparedJob,
    job: JobInBatch,
    logprobs: dict[tuple[str, int], list[TokenLogprob] | None],
) -> list[StepOutput]:
    """A job that only scores its prompts (max_tokens 0): each choice ends at once, with its
    prompt's logprobs (`logprobs`, by job id and prompt)."""
    return [
        StepOutput(
            job_id=prepared.job_id,
            text="",
            finish_reason="length",
            prompt_tokens=job.prompt_tokens,
            completion_tokens=0,
            cached_tokens=job.cached_tokens,
            logprobs=logprobs.get((prepared.job_id, choice.prompt)),
            index=i,
            choices_left=len(prepared.choices) - 1 - i,
        )
        for i, choice in enumerate(prepared.choices)
    ]
