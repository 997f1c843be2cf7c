"""Anthropic's `thinking.budget_tokens` on gpt-oss, whose template sets its reasoning length by
effort: the budget reaches the real gpt-oss template as the effort it stands for
(shared/wire/generation/reasoning.py `budget_effort`), counted by the API as the worker renders
it."""

from __future__ import annotations

from typing import Any

import pytest

from shared.queue.prompt.prompt_tokens import chat_input
from shared.wire.anthropic.messages import MessagesInput
from tests.families.vocab import family_tokenizer


def _rendered(**request: Any) -> str:
    """The gpt-oss prompt of a /v1/messages request, rendered as the worker renders it."""
    asked = MessagesInput(model="gpt-oss", messages=[{"role": "user", "content": "hi"}], **request)
    chat = chat_input(
        asked.chat_messages(),
        None,
        tools_in_template=True,
        developer_role=True,
        reasoning=asked.reasoning_control(),
    )
    text: str = family_tokenizer("gpt-oss").apply_chat_template(
        chat.messages, add_generation_prompt=True, tokenize=False, **chat.variables
    )
    return text


@pytest.mark.parametrize(
    ("budget", "level"),
    [(1, "low"), (1024, "low"), (2048, "low"), (2049, "medium"), (8192, "medium"), (8193, "high")],
)
def test_a_thinking_budget_reaches_gpt_oss_as_the_effort_it_stands_for(
    budget: int, level: str
) -> None:
    thinking = {"type": "enabled", "budget_tokens": budget}
    assert f"\nReasoning: {level}\n" in _rendered(thinking=thinking)


def test_an_effort_given_with_the_budget_wins() -> None:
    thinking = {"type": "enabled", "budget_tokens": 1024}
    prompt = _rendered(thinking=thinking, output_config={"effort": "high"})
    assert "\nReasoning: high\n" in prompt


def test_thinking_without_a_budget_leaves_the_templates_default() -> None:
    assert "\nReasoning: medium\n" in _rendered(thinking={"type": "adaptive"})
