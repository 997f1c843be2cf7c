"""The worker's announcement of how its model counts prompt tokens, for the API's check.

At start a worker builds its model's `TokenizerSpec` (shared/queue/prompt/prompt_tokens.py) from the
tokenizer mlx-lm loaded (a synthetic worker modelling prefill loads the tokenizer alone), checks
on probe conversations and prompts that `PromptCounter` counts exactly as this tokenizer does,
and writes the spec to `keys.tokenizer(model)`. If the counts differ (a template feature the
counter does not reproduce, a custom renderer), it publishes the context length alone and says
so: the API then leaves the check to the worker's own, which the engine makes before prefill in
any case.
"""

from __future__ import annotations

import logging
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper
from redis import Redis

from shared.queue.keys import Keys
from shared.queue.prompt.prompt_tokens import (
    PromptCounter,
    TokenizerSpec,
    chat_input,
    knows_developer_role,
)
from shared.wire.chat.completions import ChatMessage
from shared.wire.generation.tools import (
    ChatTool,
    FunctionCall,
    FunctionDefinition,
    ToolCall,
    ToolUse,
)
from worker.engine.sequence.calls.tool_calls import ToolFormat

log = logging.getLogger(__name__)

PROBE_CHATS = [
    [ChatMessage(role="user", content="What is the capital of France?")],
    [
        ChatMessage(role="system", content="Answer in one word."),
        ChatMessage(role="user", content="  Two\tspaces,\nnew lines \u202eRTL\u202c and 😀 "),
        ChatMessage(role="assistant", content="Fine."),
        ChatMessage(role="user", content="<|im_start|> [INST] </s> not special here"),
    ],
    [ChatMessage(role="developer", content=""), ChatMessage(role="user", content="x" * 300)],
    [
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage(
            role="assistant",
            tool_calls=[
                ToolCall(
                    id="call_1",
                    function=FunctionCall(name="weather", arguments='{"city": "Paris"}'),
                )
            ],
        ),
        ChatMessage(role="tool", tool_call_id="call_1", content="Sunny, 21 C"),
    ],
]
PROBE_TOOLS = ToolUse(
    tools=[
        ChatTool(
            type="function",
            function=FunctionDefinition(
                name="weather",
                description="The weather in a city",
                parameters={"type": "object", "properties": {"city": {"type": "string"}}},
            ),
        )
    ]
)
PROBE_TEXTS = ["The capital of France is", " leading space", "émoji 😀\n\ttabs", ""]


def build_spec(tokenizer: TokenizerWrapper, context_length: int) -> TokenizerSpec:
    wrapper: Any = tokenizer
    hf = wrapper._tokenizer
    template = getattr(hf, "chat_template", None)
    exact = TokenizerSpec(
        context_length=context_length,
        tokenizer_json=hf.backend_tokenizer.to_str(),
        chat_template=template if isinstance(template, str) else None,
        template_vars={**hf.special_tokens_map, wrapper._thinking_kwarg: wrapper.has_thinking},
        tools_in_template=ToolFormat.of(wrapper).in_template,
    )
    mismatch = _first_mismatch(exact, wrapper)
    if mismatch is None:
        return exact
    log.warning("the API cannot count this model's prompt tokens exactly (%s)", mismatch)
    return TokenizerSpec(context_length=context_length)


def _first_mismatch(spec: TokenizerSpec, wrapper: Any) -> str | None:
    try:
        counter = PromptCounter(spec)
        if getattr(wrapper, "_chat_template", None) is not None:
            return "a custom chat renderer"
        for text in PROBE_TEXTS:
            if counter.count_text(text) != len(wrapper.encode(text)):
                return f"text {text!r}"
        if spec.chat_template is None:
            return None
        for messages in PROBE_CHATS:
            for tools in (None, PROBE_TOOLS):
                developer = knows_developer_role(spec.chat_template)
                chat = chat_input(messages, tools, spec.tools_in_template, developer)
                rendered = wrapper.apply_chat_template(
                    chat.messages, tools=chat.tools, add_generation_prompt=True
                )
                if counter.count_chat(chat) != len(rendered):
                    return f"chat {messages!r}"
    except Exception as err:  # anything the counter cannot do means: do not rely on it
        return f"{type(err).__name__}: {err}"
    return None


def publish_spec(redis: Redis, keys: Keys, model: str, spec: TokenizerSpec) -> None:
    redis.hset(
        keys.tokenizer(model), mapping={"spec": spec.model_dump_json(), "digest": spec.digest()}
    )
