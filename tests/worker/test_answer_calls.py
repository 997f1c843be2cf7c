"""Llama 3.x's calls, written as the whole answer with no markers
(worker/engine/sequence/calls/answer_calls.py), read back however the text is split into tokens; and
the family told apart on its real vocabulary and template."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.wire.generation.tools import (
    ANSWER_FRAME,
    ChatTool,
    FunctionChoice,
    FunctionDefinition,
    NamedToolChoice,
    ToolChoice,
    ToolUse,
)
from tests.families.forcing import assert_forced_to_the_end
from tests.families.vocab import FAMILIES, family_tokenizer
from tests.grammar_checks import takes
from tests.tool_call_scans import scanned
from worker.engine.sequence.calls.answer_calls import AnswerCallScanner
from worker.engine.sequence.calls.scanned_calls import Scanned
from worker.engine.sequence.calls.tool_calls import ToolFormat

CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
OTHER = '{"name": "add", "parameters": {"a": 1, "b": 2}}'
TOOLS = [
    ChatTool(type="function", function=FunctionDefinition(name=name, parameters=schema))
    for name, schema in [
        ("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}}),
        ("add", {"type": "object", "properties": {"a": {"type": "integer"}}}),
    ]
]


def scan_all(pieces: list[str]) -> Scanned:
    """Every piece through one scanner, then its finish: all it gave, joined."""
    scanning = AnswerCallScanner(frozenset({"get_weather", "add"}))
    got = scanned(scanning, pieces)
    assert scanning.made == len(got.calls)
    return got


def scan(pieces: list[str]) -> tuple[str, list[tuple[str, object]]]:
    got = scan_all(pieces)
    return got.text, [(c.function.name, json.loads(c.function.arguments)) for c in got.calls]


def splits(text: str) -> st.SearchStrategy[list[str]]:
    cuts = st.lists(st.integers(0, len(text)), max_size=12).map(sorted)
    return cuts.map(lambda c: [text[a:b] for a, b in zip([0, *c], [*c, len(text)], strict=True)])


@given(pieces=splits(CALL))
def test_an_answer_that_is_a_json_call_is_the_call_and_shows_nothing(pieces: list[str]) -> None:
    assert scan(pieces) == ("", [("get_weather", {"city": "Paris"})])


@given(pieces=splits(f"\n<|python_tag|>{CALL}; {OTHER}\n"))
def test_calls_after_the_python_tag_and_separated_by_semicolons_are_each_read(
    pieces: list[str],
) -> None:
    assert scan(pieces) == ("", [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})])


@given(pieces=splits(f"{CALL}\n{OTHER}"))
def test_each_call_streams_its_name_first_then_arguments_that_add_up_to_it(
    pieces: list[str],
) -> None:
    got = scan_all(pieces)
    assert len(got.calls) == 2
    for index, call in enumerate(got.calls):
        mine = [d for d in got.deltas if d.index == index]
        assert (mine[0].id, mine[0].function.name) == (call.id, call.function.name)
        assert all(d.id is None and d.function.name is None for d in mine[1:])
        assert "".join(d.function.arguments for d in mine) == call.function.arguments


@given(pieces=splits("The weather in Paris is {sunny}."))
def test_an_answer_that_opens_with_text_is_text_even_with_braces_later(pieces: list[str]) -> None:
    assert scan(pieces) == ("The weather in Paris is {sunny}.", [])


def test_text_is_shown_as_it_streams_once_the_opening_is_not_a_call() -> None:
    scanning = AnswerCallScanner(frozenset({"add"}))
    assert scanning.feed(" ").text == ""  # could still open a call
    assert scanning.feed("Hello").text == " Hello"
    assert scanning.feed(" there").text == " there"


@pytest.mark.parametrize(
    "written",
    [
        '{"name": "unknown_tool", "parameters": {}}',  # no tool of the request
        '{"answer": 42}',  # JSON, but no call
        '<|python_tag|>brave_search.call(query="weather in Paris")',  # a built-in tool call
    ],
)
def test_an_answer_that_is_no_call_of_the_requests_tools_is_shown_as_written(
    written: str,
) -> None:
    assert scan([written]) == (written, [])


def test_a_call_cut_off_by_the_end_token_is_still_read() -> None:
    assert scan(['{"name": "add", "parameters": {"a": 1, "b": 2}']) == (
        "",
        [("add", {"a": 1, "b": 2})],
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_only_llama3_writes_its_calls_as_the_whole_answer(family: str) -> None:
    form = ToolFormat.of(family_tokenizer(family))
    assert form.whole_answer == (family == "llama3")
    if family == "llama3":
        assert form.in_template  # its template renders the tools
        assert form.call_frame() == ANSWER_FRAME  # a forced call is written in its own JSON


def accepts(choice: ToolChoice, text: str) -> bool:
    return takes(ToolUse(tools=TOOLS, choice=choice).call_grammar(ANSWER_FRAME), text)


def test_a_forced_call_is_bare_json_with_parameters_and_calls_joined_by_semicolons() -> None:
    assert accepts("required", CALL)
    assert accepts("required", f"{CALL}; {OTHER}")
    assert not accepts("required", f"<tool_call>{CALL}</tool_call>")
    assert not accepts("required", CALL.replace("parameters", "arguments"))


def test_a_named_forced_call_is_that_one_call() -> None:
    named = NamedToolChoice(type="function", function=FunctionChoice(name="add"))
    assert accepts(named, OTHER)
    assert not accepts(named, CALL)
    assert not accepts(named, f"{OTHER}; {OTHER}")


def test_a_forced_call_on_the_real_llama3_vocabulary_takes_the_calls_tokens_then_ends() -> None:
    named = NamedToolChoice(type="function", function=FunctionChoice(name="get_weather"))
    grammar = ToolUse(tools=TOOLS, choice=named).call_grammar(ANSWER_FRAME)
    assert_forced_to_the_end(grammar, CALL, "llama3", "<|eot_id|>", context=(128000, 128006))
