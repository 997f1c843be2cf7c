"""A family's tool-call reply on its vocabulary (tests/families/vocab.py), token by token through
the worker's streaming detokenizer into the scanner `ToolFormat.of` gives the model: Mistral's
`[TOOL_CALLS]` is one special token, decoded as the marker's text and read as the call, in both
its JSON-list and its `NAME[ARGS]{...}` forms (before, mlx-lm's empty end marker made every
Mistral call an empty one, shown as text)."""

from __future__ import annotations

import json

import pytest

from shared.wire.generation.tools import ChatTool, FunctionDefinition, ToolUse
from tests.families.examples import REPLIES, TOOL_ARGUMENTS
from tests.families.vocab import family_tokenizer
from worker.engine.sequence.calls.scanned_calls import Scanned
from worker.engine.sequence.calls.tool_calls import ToolFormat
from worker.engine.sequence.detokenize import byte_table_of, decoder_factory

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = ToolUse(
    tools=[
        ChatTool(
            type="function", function=FunctionDefinition(name="get_weather", parameters=WEATHER)
        )
    ]
)
END = "</s>"  # Mistral's end token: the engine stops on it, the scanner never sees it


@pytest.mark.parametrize(
    "reply",
    [
        REPLIES[("mistral", "tool-call")],
        "[TOOL_CALLS]get_weather[ARGS]" + TOOL_ARGUMENTS + END,
    ],
    ids=["json-list", "name-args"],
)
def test_a_mistral_call_streamed_from_its_tokens_is_read_as_the_call(reply: str) -> None:
    tokenizer = family_tokenizer("mistral")
    form = ToolFormat.of(tokenizer)
    assert (form.family, form.in_template) == ("mistral", True)
    ids = tokenizer.encode(reply.removesuffix(END), add_special_tokens=False)
    assert ids[0] == tokenizer.convert_tokens_to_ids(
        "[TOOL_CALLS]"
    )  # one token, as the model writes it
    decoder = decoder_factory(tokenizer, byte_table_of(tokenizer))()
    scanner = form.scanner(TOOLS)
    got = Scanned()
    for part in [
        *(scanner.feed(decoder.add(t)) for t in ids),
        scanner.feed(decoder.finish()),
        scanner.finish(),
    ]:
        got.text += part.text
        got.calls += part.calls
    assert got.text == ""
    assert [(c.function.name, json.loads(c.function.arguments)) for c in got.calls] == [
        ("get_weather", json.loads(TOOL_ARGUMENTS))
    ]
