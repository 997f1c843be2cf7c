"""OpenAI's `developer` role: a template that never names it gets a system message instead; a
template with a developer role of its own keeps it (shared/queue/prompt/prompt_tokens.py)."""

from __future__ import annotations

from shared.queue.prompt.prompt_tokens import (
    chat_input,
    compile_chat_template,
    knows_developer_role,
)
from shared.wire.chat.completions import ChatMessage

# A small template of the kind that gives developer messages their own header (gpt-oss style).
WITH_DEVELOPER = (
    "{% for m in messages %}"
    "{% if m['role'] == 'developer' %}<|developer|>{{ m['content'] }}"
    "{% else %}<|{{ m['role'] }}|>{{ m['content'] }}{% endif %}"
    "{% endfor %}"
)
# A template that renders any role by name, as SmolLM2's and most ChatML templates do.
ANY_ROLE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
CHAT = [
    ChatMessage(role="developer", content="Answer briefly."),
    ChatMessage(role="user", content="Hi"),
]


def render(template: str) -> str:
    chat = chat_input(CHAT, None, False, knows_developer_role(template))
    return compile_chat_template(template).render(messages=chat.messages)


def test_a_template_without_a_developer_role_gets_a_system_message() -> None:
    assert render(ANY_ROLE) == "<|system|>Answer briefly.<|user|>Hi"


def test_a_template_with_a_developer_role_keeps_it() -> None:
    assert render(WITH_DEVELOPER) == "<|developer|>Answer briefly.<|user|>Hi"
