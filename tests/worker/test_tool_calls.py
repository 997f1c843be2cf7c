"""Tool calls are read back from streamed text however the text is split into tokens."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial

from hypothesis import given
from hypothesis import strategies as st

from shared.wire.generation.tools import CALL_END, CALL_START
from tests.tool_call_scans import scanned
from worker.engine.sequence.calls.call_readers import (
    CallReader,
    JsonCallReader,
    ParsedCallReader,
    ReadCall,
)
from worker.engine.sequence.calls.families.syntax import Opening
from worker.engine.sequence.calls.tool_calls import MarkedCallScanner, Scanned

CALL = '{"name": "add", "arguments": {"a": 1, "b": 2}}'


def json_reader() -> CallReader:
    return JsonCallReader(frozenset({"add", "now"}))


def scan_all(pieces: list[str], reader: Callable[[], CallReader] = json_reader) -> Scanned:
    """Every piece through one scanner, then its finish: all it gave, joined."""
    return scanned(MarkedCallScanner((Opening(CALL_START, CALL_END),), reader), pieces)


def scan(pieces: list[str]) -> tuple[str, list[tuple[str, dict[str, int]]]]:
    got = scan_all(pieces)
    return got.text, [(c.function.name, json.loads(c.function.arguments)) for c in got.calls]


def splits(text: str) -> st.SearchStrategy[list[str]]:
    cuts = st.lists(st.integers(0, len(text)), max_size=12).map(sorted)
    return cuts.map(lambda c: [text[a:b] for a, b in zip([0, *c], [*c, len(text)], strict=True)])


WRITTEN = f"Let me add. {CALL_START}{CALL}{CALL_END}\n{CALL_START}{CALL}{CALL_END}"


@given(pieces=splits(WRITTEN))
def test_calls_are_parsed_and_only_the_text_around_them_is_shown(pieces: list[str]) -> None:
    shown, calls = scan(pieces)
    assert shown == "Let me add. \n"
    assert calls == [("add", {"a": 1, "b": 2})] * 2


@given(pieces=splits(f"a {CALL_START[:5]} b"))
def test_a_partial_marker_that_never_completes_is_shown(pieces: list[str]) -> None:
    assert scan(pieces) == (f"a {CALL_START[:5]} b", [])


def test_a_call_cut_off_by_the_stop_token_is_still_parsed() -> None:
    assert scan([CALL_START, CALL]) == ("", [("add", {"a": 1, "b": 2})])


def test_text_between_markers_that_does_not_parse_is_shown_as_written() -> None:
    broken = f"{CALL_START}not json{CALL_END}"
    assert scan([broken]) == (broken, [])


@given(pieces=splits(WRITTEN))
def test_each_call_streams_its_id_and_name_first_then_the_arguments_it_equals(
    pieces: list[str],
) -> None:
    got = scan_all(pieces)
    for index, call in enumerate(got.calls):
        mine = [d for d in got.deltas if d.index == index]
        assert (mine[0].id, mine[0].function.name) == (call.id, "add")
        assert all(d.id is None and d.function.name is None for d in mine[1:])
        assert "".join(d.function.arguments for d in mine) == call.function.arguments
        assert json.loads(call.function.arguments) == {"a": 1, "b": 2}


def test_arguments_stream_in_as_many_pieces_as_they_are_written_in() -> None:
    tokens = [CALL_START, '{"name": "add", "arguments": ', "{", '"a"', ": 1", ', "b', '": 2', "}}"]
    got = scan_all([*tokens, CALL_END])
    arguments = [d.function.arguments for d in got.deltas]
    assert arguments == ["", "{", '"a"', ": 1", ', "b', '": 2', "}"]
    assert got.calls[0].function.arguments == '{"a": 1, "b": 2}'


def test_arguments_written_before_the_name_are_sent_with_it() -> None:
    got = scan_all([CALL_START, '{"arguments": {"a": 1},', ' "name": "add"}', CALL_END])
    assert [(d.function.name, d.function.arguments) for d in got.deltas] == [("add", '{"a": 1}')]


def test_arguments_given_as_a_json_string_are_sent_decoded() -> None:
    got = scan_all([CALL_START, '{"name": "add", "arguments": "{\\"a\\": 1}"}', CALL_END])
    assert got.calls[0].function.arguments == '{"a": 1}'
    assert "".join(d.function.arguments for d in got.deltas) == '{"a": 1}'


def test_a_call_without_arguments_takes_an_empty_object() -> None:
    got = scan_all([CALL_START, '{"name": "now"}', CALL_END])
    assert got.calls[0].function.arguments == "{}"
    assert "".join(d.function.arguments for d in got.deltas) == "{}"


def test_a_family_parser_sends_each_call_whole_at_its_end() -> None:
    def parse(text: str, tools: object) -> list[ReadCall]:
        name, _, arguments = text.partition("|")
        return [ReadCall(name, arguments)]

    tools = [{"type": "function", "function": {"name": "add"}}]
    got = scan_all(
        [CALL_START, "add|", '{"a": 1}', CALL_END], partial(ParsedCallReader, parse, tools)
    )
    assert [(d.function.name, d.function.arguments) for d in got.deltas] == [("add", '{"a": 1}')]
    assert got.calls[0].id == got.deltas[0].id


def test_a_call_of_a_function_the_request_did_not_declare_is_shown_as_text() -> None:
    written = f'{CALL_START}{{"name": "delete everything", "arguments": {{}}}}{CALL_END}'
    got = scan_all([written])
    assert (got.text, got.deltas, got.calls) == (written, [], [])
