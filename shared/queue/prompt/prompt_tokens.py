"""Counting a job's prompt tokens on the API side, exactly as the worker will.

A worker publishes its model's `TokenizerSpec` in Redis when it starts
(worker/runtime/tokenizer_spec.py,
key `keys.tokenizer(model)`): the context window, the tokenizer as loaded (the Hugging Face
`tokenizer.json` of its backend, post-processor included) and the chat template with the
variables the worker renders it with. `PromptCounter` rebuilds that tokenizer with the
`tokenizers` library and renders the template the way Hugging Face does (a sandboxed Jinja
environment, trim_blocks and lstrip_blocks, loop controls, `raise_exception`, `tojson`,
`strftime_now`), so the API can refuse a prompt that does not fit before it is queued.

The worker publishes the tokenizer only after checking on probe conversations that this
counter agrees with its own tokenizer; otherwise `tokenizer_json` is None and the API leaves
the check to the worker (which always makes it again before prefill). The API never imports
mlx or transformers.

What the template is given is decided once, in `chat_input`, for both sides: the messages (an
assistant turn's reasoning under both names templates read it by: Qwen3's `reasoning_content`,
gpt-oss's `thinking`), the tools, and variables (the job's reasoning control as
`ReasoningControl.template_kwargs` says, then the client's `chat_template_kwargs`, which win).
A template that fails on a client's variables is the request's fault: a 400 on either side.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from jinja2 import Template, TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import BaseModel
from tokenizers import Tokenizer

from shared.queue.jobs import GenerationJob
from shared.wire.chat.completions import ChatMessage
from shared.wire.errors import InvalidRequestError
from shared.wire.generation.reasoning import ReasoningControl
from shared.wire.generation.tools import (
    ToolUse,
    fallback_call_text,
    fallback_system_prompt,
    template_call,
)


class TokenizerSpec(BaseModel):
    """What a worker publishes about its model's prompts."""

    context_length: int
    # None when the worker could not confirm that PromptCounter counts as it does.
    tokenizer_json: str | None = None
    chat_template: str | None = None
    template_vars: dict[str, Any] = {}
    # Whether tools go to the chat template (else shared/wire/generation/tools.py's fallback renders
    # them).
    tools_in_template: bool = False

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:32]


@dataclass(frozen=True)
class ChatInput:
    """What a chat template renders: the messages as dicts, the tools and the variables it is
    given (beyond those every rendering has: special tokens, `add_generation_prompt`)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    variables: dict[str, Any] = field(default_factory=dict)


def knows_developer_role(chat_template: str | None) -> bool:
    """Whether a chat template gives OpenAI's `developer` role a meaning of its own. A template
    that never names it renders any role as a turn of that name (SmolLM2's would add its default
    system prompt before a "developer" turn), so there a developer message is a system one."""
    return chat_template is not None and "developer" in chat_template


def chat_input(
    messages: list[ChatMessage],
    tools: ToolUse | None,
    tools_in_template: bool,
    developer_role: bool,
    reasoning: ReasoningControl | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> ChatInput:
    """A chat job's messages, tools and variables as the template sees them; the API's counter
    and the worker's engine both call this, so they render the same prompt. `developer_role`:
    the template's own (`knows_developer_role`), else a developer message is rendered as system.
    """
    variables = {
        **(reasoning.template_kwargs() if reasoning else {}),
        **(chat_template_kwargs or {}),
    }
    if not developer_role:
        messages = [_as_system(m) if m.role == "developer" else m for m in messages]
    if tools is not None and tools_in_template:
        return ChatInput(
            [_template_message(m) for m in messages],
            [t.model_dump(exclude_none=True) for t in tools.tools],
            variables,
        )
    rendered = [_fallback_message(m) for m in messages]
    if tools is not None:
        rendered.insert(0, {"role": "system", "content": fallback_system_prompt(tools.tools)})
    return ChatInput(rendered, None, variables)


def job_chat_input(
    job: GenerationJob, tools_in_template: bool, developer_role: bool
) -> ChatInput | None:
    """`chat_input` for a job: None for a text completion."""
    if job.messages is None:
        return None
    return chat_input(
        job.messages,
        job.tools,
        tools_in_template,
        developer_role,
        job.reasoning,
        job.chat_template_kwargs,
    )


def _as_system(m: ChatMessage) -> ChatMessage:
    return m.model_copy(update={"role": "system"})


def _with_reasoning(message: dict[str, Any], m: ChatMessage) -> dict[str, Any]:
    reasoning = m.reasoning_text()
    if reasoning:
        message["reasoning_content"] = message["thinking"] = reasoning
    return message


def _template_message(m: ChatMessage) -> dict[str, Any]:
    message: dict[str, Any] = {"role": m.role, "content": m.text()}
    if m.tool_calls:
        message["tool_calls"] = [template_call(c) for c in m.tool_calls]
    if m.tool_call_id is not None:
        message["tool_call_id"] = m.tool_call_id
    return _with_reasoning(message, m)


def _fallback_message(m: ChatMessage) -> dict[str, Any]:
    if m.role == "tool":  # any template takes a user turn; not every one takes a tool turn
        return {"role": "user", "content": f"<tool_response>\n{m.text()}\n</tool_response>"}
    calls = "".join(fallback_call_text(c) for c in m.tool_calls or [])
    return _with_reasoning({"role": m.role, "content": m.text() + calls}, m)


def template_refused(err: Exception) -> InvalidRequestError:
    """The 400 for a chat template that failed on a request (its `raise_exception`, or a
    variable of a type it cannot use)."""
    why = str(err) if isinstance(err, TemplateError) else f"{type(err).__name__}: {err}"
    return InvalidRequestError(
        f"The model's chat template refused these messages: {why[:500]}", param="messages"
    )


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_chat_template(source: str) -> Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


class PromptCounter:
    """Counts prompt tokens from a published spec that carries a tokenizer."""

    def __init__(self, spec: TokenizerSpec):
        if spec.tokenizer_json is None:
            raise ValueError("this spec carries no tokenizer")
        self.context_length = spec.context_length
        self._tokenizer = Tokenizer.from_str(spec.tokenizer_json)
        self._template = compile_chat_template(spec.chat_template) if spec.chat_template else None
        self._vars = spec.template_vars
        self._tools_in_template = spec.tools_in_template
        self._developer_role = knows_developer_role(spec.chat_template)

    def count_text(self, prompt: str) -> int:
        return len(self.encode(prompt))

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        """A text's token ids; `special_tokens`: with those the tokenizer adds around a prompt.

        Through `encode_batch`, which gives the same ids but lets go of the GIL while it works,
        where `encode` holds it throughout (measured: 0.46 s for a 400,000-character prompt, in
        which no other thread of the process ran): the API counts off its hub
        (api/http/off_hub.py), and the hub must get its turns meanwhile."""
        (encoding,) = self._tokenizer.encode_batch([text], add_special_tokens=special_tokens)
        return list(encoding.ids)

    def render_chat(self, chat: ChatInput) -> str:
        if self._template is None:
            raise InvalidRequestError("This model has no chat template; use /v1/completions.")
        try:
            return self._template.render(
                messages=chat.messages,
                tools=chat.tools,
                documents=None,
                add_generation_prompt=True,
                **{**self._vars, **chat.variables},  # as Hugging Face merges them
            )
        except Exception as err:  # the template's own code, run on the client's variables
            raise template_refused(err) from err

    def count_chat(self, chat: ChatInput) -> int:
        return len(self.encode(self.render_chat(chat), special_tokens=False))

    def ids(self, job: GenerationJob) -> list[int] | None:
        """The prompt's token ids when the job has one prompt (a chat, or one text or token
        prompt), as the worker renders it; None for several prompts."""
        chat = job_chat_input(job, self._tools_in_template, self._developer_role)
        if chat is not None:
            return self.encode(self.render_chat(chat), special_tokens=False)
        items = job.prompt_items()
        return self.item_ids(items[0]) if len(items) == 1 else None

    def item_ids(self, item: str | list[int]) -> list[int]:
        """One text completion prompt's token ids (a text, or the ids themselves)."""
        return self.encode(item) if isinstance(item, str) else list(item)

    def count(self, job: GenerationJob) -> int:
        """The job's prompt tokens; for several prompts, the longest one's (the window holds
        each prompt with its own completion)."""
        chat = job_chat_input(job, self._tools_in_template, self._developer_role)
        if chat is not None:
            return self.count_chat(chat)
        items = job.prompt_items()
        return max(self.count_text(i) if isinstance(i, str) else len(i) for i in items)
