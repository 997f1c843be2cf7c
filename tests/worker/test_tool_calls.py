"""Tool calls are read back from streamed text however the text is split into tokens."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from mlx_lm.tool_parsers import json_tools

from shared.wire.tools import CALL_END, CALL_START
from worker.engine.tool_calls import ToolCallScanner

CALL = '{"name": "add", "arguments": {"a": 1, "b": 2}}'


def scan(pieces: list[str]) -> tuple[str, list[tuple[str, dict[str, int]]]]:
    scanner = ToolCallScanner(CALL_START, CALL_END, json_tools.parse_tool_call, [])
    shown: list[str] = []
    calls = []
    for piece in pieces:
        text, made = scanner.feed(piece)
        shown.append(text)
        calls.extend(made)
    text, made = scanner.finish()
    shown.append(text)
    calls.extend(made)
    return "".join(shown), [(c.function.name, json.loads(c.function.arguments)) for c in calls]


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
