"""The grammar that forces a tool call (`tool_choice` required or named): the JSON-tools call,
written the way json.dumps writes it and no other way."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.wire.generation.tools import CALL_END, CALL_START, ChatTool, FunctionDefinition, ToolUse
from tests.grammar_checks import takes

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
FORCED = ToolUse(
    tools=[ChatTool(type="function", function=FunctionDefinition(name="w", parameters=WEATHER))],
    choice="required",
)


def accepts(text: str) -> bool:
    return takes(FORCED.call_grammar(), text)


def test_a_call_written_as_json_dumps_writes_it_is_accepted() -> None:
    body = json.dumps({"name": "w", "arguments": {"city": "Paris"}})
    assert accepts(CALL_START + body + CALL_END)


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "w", "arguments":  {"city": "Paris"}}',
        '{"name": "w",\n "arguments": {"city": "Paris"}}',
        ' {"name": "w", "arguments": {"city": "Paris"}}',
        '{"name": "w", "arguments": {"city": "Paris"} }',
    ],
)
def test_no_whitespace_may_be_added_for_a_sampled_model_to_wander_in(body: str) -> None:
    assert not accepts(CALL_START + body + CALL_END)


def test_arguments_that_break_the_schema_are_refused() -> None:
    body = json.dumps({"name": "w", "arguments": {"town": "Paris"}})
    assert not accepts(CALL_START + body + CALL_END)
