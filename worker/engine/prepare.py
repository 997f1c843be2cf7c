"""A job turned into what the batch needs, outside the engine loop (in the job's RQ slot thread).

`Preparer.prepare` renders and tokenizes the prompt (shared/queue/prompt/prompt_tokens.py's
`chat_input`, as the API counts it), applies the context-window rule
(shared/queue/prompt/context_window.py), and builds one `ChoiceSetup` per requested choice (`n`):
its sampler and, only where the job asked for them, logits processors (penalties, logit bias, a
grammar), a logprob recorder and a tool-call scanner. Every choice gets objects of its own: they
keep per-sequence state.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlx_lm.sample_utils import LogitsProcessor

from shared.queue.jobs import GenerationJob
from shared.queue.prefix.cache_scope import UNSCOPED
from shared.queue.prompt.context_window import completion_budget
from shared.queue.prompt.prompt_tokens import (
    ChatInput,
    job_chat_input,
    knows_developer_role,
    template_refused,
)
from shared.wire.errors import ContextLengthError, InvalidRequestError
from worker.engine.model import LoadedModel
from worker.engine.sequence.calls.tool_calls import ToolCallScanner, ToolFormat
from worker.engine.sequence.grammar import GrammarConstraint, Grammars
from worker.engine.sequence.harmony import HarmonySplit, HarmonyTokens
from worker.engine.sequence.logprobs import LogprobRecorder
from worker.engine.sequence.processors import processors_for
from worker.engine.sequence.reasoning import ReasoningGate, Split, ThinkMarkers, ThinkSplit
from worker.engine.sequence.sampling import Sampler, make_sampler


@dataclass(frozen=True)
class ChoiceSetup:
    """What one choice samples with; a job asking for n choices has n, sharing one prefill."""

    sampler: Sampler
    # Penalties, logit bias, a grammar: empty for a plain job, which then pays nothing for them.
    processors: tuple[LogitsProcessor, ...] = ()
    # Set when the job asked for log probabilities: the sampler, recording each draw.
    recorder: LogprobRecorder | None = None
    # Set when the job's tool calls are to be parsed out of its text.
    calls: ToolCallScanner | None = None
    prompt: int = 0  # which of the job's prompts this choice continues
    # Set for a chat job of a model that reasons: its reasoning kept apart from its content.
    split: Split | None = None


@dataclass(frozen=True)
class PreparedJob:
    job_id: str
    prompts: tuple[list[int], ...]  # one for a chat job; a text completion may have several
    max_tokens: int  # per choice; 0 scores the prompts only
    choices: tuple[ChoiceSetup, ...]  # n per prompt, in OpenAI's index order
    stops: tuple[str, ...]
    # Leading prompt tokens other requests are likely to share (chat history, system prompt).
    shared_tokens: int = 0
    # Set when the prompt tokens' own logprobs are wanted (an echoed text completion).
    prompt_logprobs: int | None = None
    # A client waits on it (not a background response or a batch line): its prefill is paced.
    interactive: bool = True
    # Whose prefix cache entries it reuses and adds to, and whether those may go to disk
    # (shared/queue/prefix/cache_scope.py, shared/queue/jobs.py).
    cache_scope: str = UNSCOPED
    keep_on_disk: bool = True
    # The tokens of the text it predicted (OpenAI's `prediction`): a draft source.
    predicted: tuple[int, ...] = ()

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def reasons(self) -> bool:
        """Whether its output may carry reasoning (its model keeps reasoning apart)."""
        return any(choice.split is not None for choice in self.choices)


class Preparer:
    def __init__(
        self,
        loaded: LoadedModel,
        default_max_tokens: int,
        with_history: bool,
        kv_window: int | None = None,
    ):
        self._loaded = loaded
        self._kv_window = kv_window  # positions one sequence's KV may hold (MLXQ_KV_TOKENS)
        self._default_max_tokens = default_max_tokens
        self._with_history = with_history  # only a prefix cache uses the history's length
        self._grammars = Grammars(loaded.tokenizer._tokenizer, loaded.stop_ids, loaded.vocab_size)
        self._tool_format = ToolFormat.of(loaded.tokenizer)
        self._think = ThinkMarkers.of(loaded.tokenizer)
        self._harmony = HarmonyTokens.of(loaded.tokenizer)
        template = getattr(loaded.tokenizer._tokenizer, "chat_template", None)
        self._developer_role = knows_developer_role(template if isinstance(template, str) else None)

    def prepare(self, job: GenerationJob) -> PreparedJob:
        """Tokenize the job and fix its limits; raises an InvalidRequestError if it cannot run."""
        chat = job_chat_input(job, self._tool_format.in_template, self._developer_role)
        prompts = self._tokenize(job, chat)
        where = "messages" if job.messages is not None else "prompt"
        window = self._loaded.context_length
        ceiling = job.max_tokens_ceiling
        budget = min(
            completion_budget(len(p), job.max_tokens, window, where, ceiling=ceiling)
            for p in prompts
        )
        if job.max_tokens is None:
            budget = min(budget, self._default_max_tokens)
        if self._kv_window is not None:
            longest = max(len(p) for p in prompts)
            # A ceiling shrinks to what a row holds, as a budget nobody asked for does.
            asked = None if ceiling else job.max_tokens
            budget = fit_kv(longest, asked, budget, self._kv_window, where)
        choices = [
            self._choice(job, k * job.n + i, prompt=k, tokens=prompts[k])
            for k in range(len(prompts))
            for i in range(job.n)
        ]
        return PreparedJob(
            job_id=job.job_id,
            prompts=tuple(prompts),
            max_tokens=budget,
            choices=tuple(choices),
            stops=tuple(job.stop),
            shared_tokens=self._history_tokens(chat, prompts[0]),
            prompt_logprobs=job.prompt_logprobs,
            interactive=job.lane == "interactive",
            cache_scope=job.cache_scope,
            keep_on_disk=job.keep_on_disk,
            predicted=tuple(self._predicted(job)),
        )

    def _predicted(self, job: GenerationJob) -> list[int]:
        if not job.prediction:
            return []
        return list(self._loaded.tokenizer.encode(job.prediction, add_special_tokens=False))

    def _choice(
        self, job: GenerationJob, index: int, prompt: int, tokens: list[int]
    ) -> ChoiceSetup:
        sampling = job.sampling
        if sampling.seed is not None and index:  # each choice its own draws, still reproducible
            sampling = sampling.model_copy(update={"seed": sampling.seed + index})
        sampler = make_sampler(sampling)
        recorder = None
        if job.logprobs is not None:
            recorder = sampler = LogprobRecorder(sampler, job.logprobs, self._loaded.token_piece)
        calls = None
        if job.tools is not None and job.tools.parses_calls():
            calls = self._tool_format.scanner(job.tools)
        processors, grammar = self._processors(job)
        split: Split | None = None
        budget = job.reasoning.budget_tokens if job.reasoning is not None else None
        if job.messages is not None and self._harmony is not None:
            # A budget reached the template as an effort (shared/wire/generation/reasoning.py):
            # harmony sets its reasoning length by effort, and its analysis is not cut short.
            split = HarmonySplit(self._harmony)
            if grammar is not None:
                raise InvalidRequestError(
                    "This model writes harmony messages; an output format or a forced tool "
                    "call cannot be enforced on them yet.",
                    param="response_format" if job.grammar is not None else "tool_choice",
                )
        elif job.messages is not None and self._think is not None:
            inside = self._think.opens_inside(tokens)
            split = ThinkSplit(self._think, inside)
            if budget is not None or grammar is not None:
                processors += (ReasoningGate(self._think, inside, budget, grammar),)
                grammar = None
        if grammar is not None:
            processors += (grammar,)
        return ChoiceSetup(sampler, processors, recorder, calls, prompt, split)

    def _processors(
        self, job: GenerationJob
    ) -> tuple[tuple[LogitsProcessor, ...], GrammarConstraint | None]:
        """The job's sampling processors, and its grammar apart (a reasoning model's waits for
        the end of its reasoning)."""
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
            grammar = self._tool_format.call_grammar(job.tools)
            if grammar is None:
                raise InvalidRequestError(
                    "This model writes tool calls in a format that cannot be forced; "
                    "use tool_choice 'auto'.",
                    param="tool_choice",
                )
        constraint = self._grammars.constraint(grammar) if grammar is not None else None
        return tuple(found), constraint

    def _tokenize(self, job: GenerationJob, chat: ChatInput | None) -> list[list[int]]:
        tokenizer = self._loaded.tokenizer
        if chat is not None:
            try:
                prompts: list[list[int]] = [
                    tokenizer.apply_chat_template(
                        chat.messages,
                        tools=chat.tools,
                        add_generation_prompt=True,
                        **chat.variables,
                    )
                ]
            except Exception as err:  # the template's own code, run on the client's variables
                raise template_refused(err) from err
        else:
            prompts = [
                tokenizer.encode(item) if isinstance(item, str) else item
                for item in job.prompt_items()
            ]
        if not all(prompts):
            raise InvalidRequestError("The prompt is empty.", param="prompt")
        outside = [t for p in prompts for t in p if t >= self._loaded.vocab_size]
        if outside:
            raise InvalidRequestError(
                f"The prompt names token {outside[0]}, which is not in this model's vocabulary.",
                param="prompt",
            )
        return prompts

    def _history_tokens(self, chat: ChatInput | None, prompt: list[int]) -> int:
        """How many prompt tokens come before the last message's text: the template's system
        prompt and the earlier turns, which the next request of a conversation shares."""
        if not self._with_history or chat is None:
            return 0
        *earlier, last = chat.messages
        head: list[int] = self._loaded.tokenizer.apply_chat_template(
            [*earlier, {"role": last["role"], "content": ""}],
            tools=chat.tools,
            add_generation_prompt=False,
            **chat.variables,
        )
        same = 0
        for a, b in zip(head, prompt, strict=False):
            if a != b:
                break
            same += 1
        return same


def fit_kv(prompt: int, asked: int | None, budget: int, window: int, where: str) -> int:
    """The completion budget within a worker's KV budget (`window`: the positions one sequence
    may take, the whole budget when it runs alone): a default budget shrinks to fit, an
    asked-for one that cannot fit is refused, naming the settings that size the budget."""
    if prompt + budget <= window:
        return budget
    if asked is None and prompt < window:
        return window - prompt
    raise ContextLengthError(
        f"This model's KV budget holds {window} tokens (MLXQ_POOL_KV_TOKENS, or the catalog "
        f"entry's kv=, under the pool; MLXQ_KV_TOKENS on a worker started alone). "
        f"However, you requested {prompt + budget} tokens ({prompt} in the {where}, "
        f"{budget} in the completion). Please reduce the length of the {where} or completion.",
        param=where,
    )
