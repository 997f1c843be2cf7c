"""The engine: a loaded model generating many sequences in one continuous batch.

It knows nothing of Redis or HTTP. Its surface follows mlx-lm's BatchGenerator: `prepare` turns
a job into prompt tokens and limits (and refuses what cannot run), `insert` queues it for the
batch, `step` lets the queued jobs in together and advances every sequence by one token,
returning what each may show now, `remove` drops sequences (cancellation). Each sequence's
state is a `Sequence` dataclass. A prompt whose opening the prefix cache holds
(worker/prefix_cache.py) enters the batch with a copy of that KV cache and only its remaining
tokens to prefill.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mlx_lm import load
from mlx_lm.generate import BatchGenerator, StopSequences
from mlx_lm.sample_utils import LogitsProcessor
from mlx_lm.tokenizer_utils import TokenizerWrapper

from shared.completions import TokenLogprob
from shared.errors import ContextLengthError, InvalidRequestError
from shared.jobs import GenerationJob
from shared.prompt_tokens import chat_input
from shared.tools import ToolCall
from worker.decode import use_decode_batch
from worker.detokenize import TextDecoder, decoder_factory, token_pieces
from worker.grammar import Grammars
from worker.logprobs import LogprobRecorder
from worker.prefix_cache import PrefixCache, Reuse, level
from worker.processors import processors_for
from worker.sampling import Sampler, make_sampler
from worker.stop import StopStringMatcher, stop_token_ids
from worker.tool_calls import ToolCallScanner, ToolFormat


@dataclass(frozen=True)
class PreparedJob:
    """A job turned into what the batch needs; built outside the engine loop."""

    job_id: str
    prompt: list[int]
    max_tokens: int
    sampler: Sampler
    stops: tuple[str, ...]
    # Leading prompt tokens other requests are likely to share (chat history, system prompt).
    shared_tokens: int = 0
    # Penalties, logit bias, a grammar: empty for a plain job, which then pays nothing for them.
    processors: tuple[LogitsProcessor, ...] = ()
    # Set when the job asked for log probabilities: the sampler, recording each draw.
    recorder: LogprobRecorder | None = None
    # Set when the job's tool calls are to be parsed out of its text.
    calls: ToolCallScanner | None = None


@dataclass
class Sequence:
    """One running sequence's state."""

    job_id: str
    prompt_tokens: int
    cached_tokens: int
    decoder: TextDecoder
    matcher: StopStringMatcher
    recorder: LogprobRecorder | None
    calls: ToolCallScanner | None
    completion_tokens: int = 0


@dataclass(frozen=True)
class StepOutput:
    """What one step produced for one sequence: new visible text, and why it ended if it did.

    A sequence whose own work failed ends with finish_reason "error" and the reason in `error`.
    """

    job_id: str
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list[ToolCall] | None = None


class BatchEngine(Protocol):
    """What the engine loop and the job function need from an engine."""

    def prepare(self, job: GenerationJob) -> PreparedJob: ...
    def insert(self, prepared: PreparedJob) -> None: ...
    def step(self) -> list[StepOutput]: ...
    def remove(self, job_ids: list[str]) -> None: ...


@dataclass(frozen=True)
class LoadedModel:
    model: Any  # an mlx.nn.Module
    tokenizer: TokenizerWrapper
    context_length: int
    stop_ids: frozenset[int]
    new_decoder: Callable[[], TextDecoder]
    vocab_size: int  # the width of the model's logits
    token_piece: Callable[[int], bytes]


def load_model(path: str) -> LoadedModel:
    model, tokenizer, config = load(path, return_config=True)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        context_length=_context_length(config),
        stop_ids=stop_token_ids(
            tokenizer.eos_token_ids, _generation_config_eos(Path(path)), _token_lookup(tokenizer)
        ),
        new_decoder=decoder_factory(tokenizer),
        vocab_size=int(config.get("vocab_size") or len(tokenizer.get_vocab())),
        token_piece=token_pieces(tokenizer),
    )


def _context_length(config: dict[str, Any]) -> int:
    for key in ("max_position_embeddings", "max_seq_len", "n_positions", "context_length"):
        if isinstance(config.get(key), int):
            return int(config[key])
    return 4096


def _generation_config_eos(path: Path) -> list[int]:
    file = path / "generation_config.json"
    if not file.is_file():
        return []
    eos = json.loads(file.read_text()).get("eos_token_id")
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else [int(i) for i in eos]


def _token_lookup(tokenizer: TokenizerWrapper) -> Any:
    vocab: dict[str, int] = tokenizer.get_vocab()
    return vocab.get


class Engine:
    """Continuous batching over mlx-lm's BatchGenerator, with our stop handling on top."""

    def __init__(
        self,
        loaded: LoadedModel,
        batch_size: int,
        default_max_tokens: int,
        prefixes: PrefixCache | None = None,
    ):
        self._loaded = loaded
        self._prefixes = prefixes
        self._default_max_tokens = default_max_tokens
        self._stop_sequences = StopSequences([[i] for i in sorted(loaded.stop_ids)])
        self._batch = BatchGenerator(
            loaded.model,
            completion_batch_size=batch_size,
            # A burst of requests is prefilled as one group: one stall of the running sequences
            # instead of several, and larger matrix products (measured: bench/results).
            prefill_batch_size=batch_size,
            prefill_step_size=512,
        )
        use_decode_batch(self._batch)
        self._grammars = Grammars(loaded.tokenizer._tokenizer, loaded.stop_ids, loaded.vocab_size)
        self._tool_format = ToolFormat.of(loaded.tokenizer)
        self._pending: list[PreparedJob] = []
        self._by_uid: dict[int, Sequence] = {}
        self._uid_of: dict[str, int] = {}

    @property
    def active(self) -> int:
        return len(self._by_uid) + len(self._pending)

    def prepare(self, job: GenerationJob) -> PreparedJob:
        """Tokenize the job and fix its limits; raises an InvalidRequestError if it cannot run."""
        prompt = self._tokenize(job)
        room = self._loaded.context_length - len(prompt)
        if room < 1:
            raise ContextLengthError(
                f"The prompt has {len(prompt)} tokens; this model's context window is "
                f"{self._loaded.context_length} tokens.",
                param="messages" if job.messages is not None else "prompt",
            )
        wanted = job.max_tokens or self._default_max_tokens
        sampler = make_sampler(job.sampling)
        recorder = None
        if job.logprobs is not None:
            recorder = sampler = LogprobRecorder(sampler, job.logprobs, self._loaded.token_piece)
        return PreparedJob(
            job_id=job.job_id,
            prompt=prompt,
            max_tokens=min(wanted, room),
            sampler=sampler,
            stops=tuple(job.stop),
            shared_tokens=self._history_tokens(job, prompt),
            processors=self._processors(job),
            recorder=recorder,
            calls=self._tool_format.scanner(job.tools)
            if job.tools is not None and job.tools.parses_calls()
            else None,
        )

    def _processors(self, job: GenerationJob) -> tuple[LogitsProcessor, ...]:
        outside = [t for t in job.sampling.logit_bias if t >= self._loaded.vocab_size]
        if outside:
            raise InvalidRequestError(
                f"logit_bias names token {outside[0]}, which is not in this model's vocabulary "
                f"of {self._loaded.vocab_size} tokens.",
                param="logit_bias",
            )
        found = processors_for(job.sampling)
        grammar = job.grammar
        if job.tools is not None and job.tools.constrained():
            if not self._tool_format.constrainable():
                raise InvalidRequestError(
                    "This model writes tool calls in a format that cannot be forced; "
                    "use tool_choice 'auto'.",
                    param="tool_choice",
                )
            grammar = job.tools.call_grammar()
        if grammar is not None:
            found.append(self._grammars.constraint(grammar))
        return tuple(found)

    def _tokenize(self, job: GenerationJob) -> list[int]:
        tokenizer = self._loaded.tokenizer
        if job.messages is not None:
            chat = chat_input(job.messages, job.tools, self._tool_format.in_template)
            tokens: list[int] = tokenizer.apply_chat_template(
                chat.messages, tools=chat.tools, add_generation_prompt=True
            )
        else:
            tokens = tokenizer.encode(job.prompt or "")
        if not tokens:
            raise InvalidRequestError("The prompt is empty.", param="prompt")
        return tokens

    def _history_tokens(self, job: GenerationJob, prompt: list[int]) -> int:
        """How many prompt tokens come before the last message's text: the template's system
        prompt and the earlier turns, which the next request of a conversation shares."""
        if self._prefixes is None or not job.messages:
            return 0
        chat = chat_input(job.messages, job.tools, self._tool_format.in_template)
        *earlier, last = chat.messages
        head: list[int] = self._loaded.tokenizer.apply_chat_template(
            [*earlier, {"role": last["role"], "content": ""}],
            tools=chat.tools,
            add_generation_prompt=False,
        )
        same = 0
        for a, b in zip(head, prompt, strict=False):
            if a != b:
                break
            same += 1
        return same

    def insert(self, prepared: PreparedJob) -> None:
        """Queue the job for the batch; it enters at the next step, with whatever else came."""
        self._pending.append(prepared)

    def _enter_pending(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        prompts = [p.prompt for p in pending]
        reuses = level(prompts, [self._reuse(p) for p in pending])
        uids = self._batch.insert(
            [p[r.tokens :] for p, r in zip(prompts, reuses, strict=True)],
            max_tokens=[p.max_tokens for p in pending],
            caches=[r.cache for r in reuses],
            all_tokens=[p[: r.tokens] for p, r in zip(prompts, reuses, strict=True)],
            samplers=[p.sampler for p in pending],
            stop_sequences=[self._stop_sequences] * len(pending),
            logits_processors=[list(p.processors) for p in pending],
        )
        for uid, prepared, reuse in zip(uids, pending, reuses, strict=True):
            self._by_uid[uid] = Sequence(
                job_id=prepared.job_id,
                prompt_tokens=len(prepared.prompt),
                cached_tokens=reuse.hits,
                decoder=self._new_decoder(prepared),
                matcher=StopStringMatcher(prepared.stops),
                recorder=prepared.recorder,
                calls=prepared.calls,
            )
            self._uid_of[prepared.job_id] = uid

    def _new_decoder(self, prepared: PreparedJob) -> TextDecoder:
        return self._loaded.new_decoder()

    def _reuse(self, prepared: PreparedJob) -> Reuse:
        if self._prefixes is None:
            return Reuse(None, 0, 0)
        return self._prefixes.reuse(prepared.prompt, prepared.shared_tokens)

    def step(self) -> list[StepOutput]:
        """Advance every sequence by one token (prompts by one chunk)."""
        self._enter_pending()
        _, generated = self._batch.next()
        outputs = [self._advance_one(r.uid, r.token, r.finish_reason) for r in generated]
        if self._prefixes is not None:
            for r in generated:
                if r.prompt_cache is not None and r.all_tokens is not None:
                    self._prefixes.store(r.all_tokens, r.prompt_cache)
        finished = [o.job_id for o in outputs if o.finish_reason is not None]
        self.remove(finished)
        return outputs

    def _advance_one(self, uid: int, token: int, finish_reason: str | None) -> StepOutput:
        """One sequence's share of a step: if it fails, that sequence ends, not the batch."""
        try:
            return self._advance(uid, token, finish_reason)
        except Exception as err:
            seq = self._by_uid[uid]
            return StepOutput(
                job_id=seq.job_id,
                text="",
                finish_reason="error",
                prompt_tokens=seq.prompt_tokens,
                completion_tokens=seq.completion_tokens,
                cached_tokens=seq.cached_tokens,
                error=f"{type(err).__name__}: {err}",
            )

    def _advance(self, uid: int, token: int, finish_reason: str | None) -> StepOutput:
        seq = self._by_uid[uid]
        seq.completion_tokens += 1
        text = ""
        logprobs = None
        if seq.recorder is not None:
            entry = seq.recorder.take()
            logprobs = [] if token in self._loaded.stop_ids else [entry]
        if token not in self._loaded.stop_ids:
            text = seq.matcher.feed(seq.decoder.add(token))
        if seq.matcher.matched:
            finish_reason = "stop"
        elif finish_reason is not None:
            text += seq.matcher.feed(seq.decoder.finish()) + seq.matcher.flush()
            finish_reason = "stop" if seq.matcher.matched else finish_reason
        calls = None
        if seq.calls is not None:
            text, calls = self._scan(seq.calls, text, finish_reason is not None)
            if seq.calls.made and finish_reason == "stop":
                finish_reason = "tool_calls"
        return StepOutput(
            job_id=seq.job_id,
            text=text,
            finish_reason=finish_reason,
            prompt_tokens=seq.prompt_tokens,
            completion_tokens=seq.completion_tokens,
            cached_tokens=seq.cached_tokens,
            logprobs=logprobs,
            tool_calls=calls,
        )

    @staticmethod
    def _scan(scanner: ToolCallScanner, text: str, last: bool) -> tuple[str, list[ToolCall] | None]:
        shown, calls = scanner.feed(text)
        if last:
            rest, more = scanner.finish()
            shown, calls = shown + rest, calls + more
        return shown, calls or None

    def remove(self, job_ids: list[str]) -> None:
        self._pending = [p for p in self._pending if p.job_id not in job_ids]
        uids = [self._uid_of.pop(j) for j in job_ids if j in self._uid_of]
        if uids:
            # Sequences mlx-lm already retired (stop token, max_tokens) are simply not found.
            self._batch.remove(uids)
            for uid in uids:
                del self._by_uid[uid]
