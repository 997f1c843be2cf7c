"""Wire formats of /v1/chat/completions and /v1/completions: OpenAI's requests and responses.

Requests forbid unknown fields (OpenAI answers those with 400 too). Fields OpenAI defines that
mlxq does not implement are declared so that their default value passes and any other value
is refused with a 400 naming the parameter, never silently ignored.

Every size a request can choose is bounded here (the limits below and a message's in
shared/wire/chat/chat_messages.py, in the OpenAPI document too),
each refused with OpenAI's code: `array_above_max_length`, `string_above_max_length`,
`integer_above_max_value` (api/http/errors.py). The body as a whole is bounded by
MLXQ_MAX_BODY_BYTES.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from shared.wire.chat.chat_messages import MAX_CONTENT_CHARS as MAX_CONTENT_CHARS
from shared.wire.chat.chat_messages import MAX_CONTENT_PARTS as MAX_CONTENT_PARTS
from shared.wire.chat.chat_messages import ChatMessage as ChatMessage
from shared.wire.chat.chat_messages import HistoryText, TextPart
from shared.wire.digits import parse_integer
from shared.wire.errors import InvalidRequestError, UnsupportedParameterError
from shared.wire.fleet.keep_alive import KeepAlive
from shared.wire.generation.grammar import ResponseFormat
from shared.wire.generation.reasoning import Effort, ReasoningControl
from shared.wire.generation.sampling import SamplingParams
from shared.wire.generation.tools import (
    MAX_TOOLS,
    ChatTool,
    NamedToolChoice,
    ToolChoice,
    ToolUse,
    check_tools,
)
from shared.wire.ids import MODEL_NAME_PATTERN as MODEL_NAME_PATTERN
from shared.wire.images import ImageInput

FinishReason = Literal["stop", "length", "tool_calls"]
ServiceTier = Literal["auto", "default", "flex"]

# Limits on what a request may ask for.
MAX_MESSAGES = 2048  # messages in one chat request (OpenAI's limit)
MAX_STOP = 4  # stop strings (OpenAI's limit)
MAX_STOP_CHARS = 256  # characters in one stop string
MAX_N = 128  # OpenAI's cap on n
MAX_LOGIT_BIAS = 300  # entries in logit_bias (OpenAI's limit)
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs (OpenAI's limit); completions take up to 5
MAX_TOKENS = 131_072  # max_tokens / max_completion_tokens; the context window bounds it too
MAX_METADATA = 16  # metadata pairs, keys up to 64 and values up to 512 characters (OpenAI's)
SEED_RANGE = (-(2**63), 2**63 - 1)  # a 64-bit integer, as OpenAI takes
# vLLM's `priority` bounds, so that a job's priority stays exact in Redis's doubles (it orders a
# caller's own jobs: shared/queue/fair_order.py).
PRIORITY_LIMIT = 2**20

StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
TokenCount = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
Penalty = Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]
PromptText = Annotated[str, Field(max_length=MAX_CONTENT_CHARS)]
TokenIds = Annotated[
    list[Annotated[int, Field(ge=0, le=2**31 - 1)]],
    Field(min_length=1, max_length=MAX_CONTENT_CHARS),
]
Bias = Annotated[float, Field(ge=-100, le=100, allow_inf_nan=False)]
# Variables a client adds to the chat template (`chat_template_kwargs`, vLLM's and
# mlx_lm.server's), under names a template can read.
MAX_TEMPLATE_KWARGS = 64
TemplateKwargs = Annotated[
    dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")], Any],
    Field(max_length=MAX_TEMPLATE_KWARGS),
]
# What mlxq itself gives the template, or the renderer takes as its own arguments: a client's
# variable of one of these names would replace the conversation or break the rendering.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "raise_exception",
        "strftime_now",
    }
)


def _stop_list(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else value


def _refuse(param: str, why: str) -> None:
    raise UnsupportedParameterError(f"'{param}' is not supported: {why}", param=param)


class PromptTokensDetails(BaseModel):
    # Prompt tokens whose KV state came from the worker's prefix cache
    # (worker/engine/prefix_cache.py).
    cached_tokens: int = 0


class CompletionTokensDetails(BaseModel):
    # Completion tokens a reasoning model spent thinking (worker/engine/sequence/reasoning.py).
    reasoning_tokens: int = 0
    # Drafted tokens from the request's `prediction` that the answer kept, and those it did not
    # (worker/engine/sequence/drafts.py): OpenAI's predicted-outputs counts.
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()
    completion_tokens_details: CompletionTokensDetails = CompletionTokensDetails()


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class SamplingRequest(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="forbid")

    model: Annotated[str, Field(pattern=MODEL_NAME_PATTERN)]
    temperature: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 1.0
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP)] | None = None
    seed: Annotated[int, Field(ge=SEED_RANGE[0], le=SEED_RANGE[1])] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: Annotated[dict[str, Bias], Field(max_length=MAX_LOGIT_BIAS)] | None = None
    # vLLM's sampling extensions, under vLLM's names (0 / 1.0 leave them off).
    top_k: Annotated[int, Field(ge=-1, le=MAX_TOKENS)] = 0
    min_p: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 0.0
    repetition_penalty: Annotated[float, Field(gt=0, le=10, allow_inf_nan=False)] = 1.0
    # vLLM's: lower runs earlier among the caller's own queued jobs (shared/queue/fair_order.py).
    priority: Annotated[int, Field(ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)] = 0
    # Ollama's: how long the model stays loaded once idle after this request (the pool,
    # worker/pool/agent.py); None: the model's own keep-alive.
    keep_alive: KeepAlive | None = None
    # vLLM's: the prefix cache's entries are shared only by requests giving the same salt, within
    # the caller's own scope (shared/queue/prefix/cache_scope.py).
    cache_salt: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    user: str | None = None
    metadata: (
        Annotated[
            dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
            Field(max_length=MAX_METADATA),
        ]
        | None
    ) = None

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        if any(s == "" for s in _stop_list(value)):
            raise ValueError("stop strings must not be empty")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if any(parse_integer(key, max_digits=9) is None for key in value or {}):
            raise ValueError(
                "logit_bias keys must be token ids (integers written in ASCII digits 0-9)"
            )
        return value

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> SamplingRequest:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    def stop_strings(self) -> list[str]:
        return _stop_list(self.stop)

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            top_k=max(self.top_k, 0),
            min_p=self.min_p,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            logit_bias={int(k): v for k, v in (self.logit_bias or {}).items()},
        )


class PromptCacheOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] | None = None


class Prediction(BaseModel):
    """OpenAI's Predicted Outputs: text the answer is expected to repeat, to decode it faster."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["content"]
    content: HistoryText | Annotated[list[TextPart], Field(max_length=MAX_CONTENT_PARTS)]

    def text(self) -> str:
        """The predicted text, its parts joined."""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


# Chat fields OpenAI defines whose only value mlxq can honour is "not set" (or the one named
# here): any other is refused with a 400 naming the field.
_HONOURED_ONLY_UNSET = {
    "audio": "the models served write text only",
    "moderation": "mlxq runs no moderation model",
    "web_search_options": "mlxq has no web search",
}


class ChatCompletionRequest(SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tools: Annotated[list[ChatTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    response_format: ResponseFormat | None = None
    # Chat completions are not stored, and one tier serves all; `store: false` keeps what the
    # request adds to the prefix cache in memory, off the disk tier (shared/queue/jobs.py).
    store: bool | None = None
    service_tier: ServiceTier | None = None
    # How a reasoning model thinks (shared/wire/generation/reasoning.py): OpenAI's effort, vLLM's
    # budget of reasoning tokens, and variables for the chat template (vLLM's and mlx_lm.server's).
    reasoning_effort: Effort | None = None
    thinking_token_budget: Annotated[int, Field(ge=0, le=MAX_TOKENS)] | None = None
    chat_template_kwargs: TemplateKwargs | None = None
    # `prompt_cache_key` is a placement hint, scoped by the caller (shared/queue/jobs.py
    # `cache_hint`, api/queue/placement.py). Accepted and changing nothing here: the worker's
    # prefix cache reuses a repeated prompt opening without breakpoints or a retention policy;
    # mlxq checks no policies per end user. A prediction is a draft source where the worker
    # speculates (MLXQ_SPECULATION_TOKENS).
    prompt_cache_key: Annotated[str, Field(max_length=1024)] | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prediction: Prediction | None = None
    safety_identifier: Annotated[str, Field(max_length=256)] | None = None
    # Their default passes; any other value is a 400 naming them.
    verbosity: Literal["low", "medium", "high"] | None = None
    modalities: Annotated[list[Literal["text", "audio"]], Field(max_length=2)] | None = None
    audio: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _no_reserved_names(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        for name in sorted(RESERVED_TEMPLATE_KWARGS & set(value or {})):
            _refuse(f"chat_template_kwargs.{name}", "mlxq gives the chat template this itself")
        return value

    @model_validator(mode="after")
    def _refuse_unsupported_chat(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequestError(
                "top_logprobs requires logprobs to be true", param="top_logprobs"
            )
        for name in ("functions", "function_call"):
            if getattr(self, name) is not None:
                _refuse(name, "the deprecated functions API is replaced by tools")
        for name, why in _HONOURED_ONLY_UNSET.items():
            if getattr(self, name) is not None:
                _refuse(name, why)
        if self.verbosity not in (None, "medium"):
            _refuse("verbosity", "the models served have no verbosity setting")
        if self.modalities is not None and "audio" in self.modalities:
            _refuse("modalities", "the models served write text only")
        if self.response_format is not None:
            self.response_format.grammar("response_format")  # refuse what cannot be compiled
        return self

    @model_validator(mode="after")
    def _check_tools(self) -> ChatCompletionRequest:
        if self.tools:
            check_tools(self.tools)
        elif self.tool_choice not in (None, "none"):
            raise InvalidRequestError("tool_choice requires tools", param="tool_choice")
        named = self.tool_choice
        if isinstance(named, NamedToolChoice) and named.function.name not in self.tool_names():
            raise InvalidRequestError(
                f"tool_choice names '{named.function.name}', which is not in tools",
                param="tool_choice",
            )
        use = self.tool_use()
        if self.response_format is not None and use is not None and use.constrained():
            raise InvalidRequestError(
                "a forced tool call cannot also follow response_format", param="tool_choice"
            )
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def images(self) -> list[ImageInput]:
        """The images the messages carry, in order, each named by its parameter."""
        return [image for i, m in enumerate(self.messages) for image in m.images(f"messages.{i}")]

    def reasoning_control(self) -> ReasoningControl | None:
        """The reasoning control the job carries; None: the template's default."""
        if self.reasoning_effort is None and self.thinking_token_budget is None:
            return None
        return ReasoningControl.of_effort(self.reasoning_effort, self.thinking_token_budget)

    def tool_names(self) -> set[str]:
        return {t.function.name for t in self.tools or []}

    def tool_use(self) -> ToolUse | None:
        if not self.tools:
            return None
        parallel = True if self.parallel_tool_calls is None else self.parallel_tool_calls
        return ToolUse(tools=self.tools, choice=self.tool_choice or "auto", parallel=parallel)

    def logprob_alternatives(self) -> int | None:
        """None: no logprobs; k: the chosen token's logprob and its k best alternatives."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(SamplingRequest):
    # One prompt (text or token ids) or several (one set of n choices each, in order).
    prompt: PromptText | TokenIds | Annotated[list[PromptText | TokenIds], Field(min_length=1)]
    # 0 (with echo) scores the prompt without generating: an eval harness's loglikelihood.
    max_tokens: Annotated[int, Field(ge=0, le=MAX_TOKENS)] = 16
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    best_of: int | None = None
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        """The prompts as a list: one per set of n choices."""
        prompt = self.prompt
        if isinstance(prompt, str) or all(isinstance(t, int) for t in prompt):
            return [cast(str | list[int], prompt)]
        return cast(list[str | list[int]], prompt)

    @model_validator(mode="after")
    def _refuse_unsupported_text(self) -> CompletionRequest:
        prompts = self.prompts()
        if len(prompts) * self.n > MAX_N:
            raise InvalidRequestError(
                f"{len(prompts)} prompts with n={self.n} ask for more than {MAX_N} choices",
                param="n",
            )
        if self.echo and any(not isinstance(p, str) for p in prompts):
            _refuse("echo", "a prompt given as token ids cannot be echoed")
        if self.max_tokens == 0 and not self.echo:
            raise InvalidRequestError("max_tokens 0 needs echo: true", param="max_tokens")
        if self.best_of not in (None, 1):
            _refuse("best_of", "only best_of=1 is implemented")
        if self.suffix:
            _refuse("suffix", "insertion is not implemented")
        return self
