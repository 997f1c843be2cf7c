"""Every family's tool-call corpus (tests/families/data/tool_calls/<family>.json: a model's
output, the request's tools, and the calls it makes or "text") read as the corpus says, however
the output is split into pieces; mlx-lm's parser for the family reads each case as the corpus
records (the same, or differently, and why mlxq's reading is the right one); and a model whose
chat template marks the family is given the family's syntax.

A case whose output is "text" is shown as written and makes no call, so the engine ends it with
finish_reason "stop" (worker/engine/generation/step_output.py turns a sequence's finish into
"tool_calls" only when its scanner made a call).
"""

from __future__ import annotations

import importlib
import json
import random
from pathlib import Path
from typing import Any

import pytest
from mlx_lm.tokenizer_utils import _infer_tool_parser

from shared.wire.generation.tools import ChatTool, ToolUse
from tests.tool_call_scans import scanned
from worker.engine.sequence.calls.families.mlx_lm_parsers import module_syntax
from worker.engine.sequence.calls.families.syntax import CallSyntax
from worker.engine.sequence.calls.scanned_calls import Scanned
from worker.engine.sequence.calls.tool_calls import ToolFormat

CORPUS = Path(__file__).parent / "data" / "tool_calls"
FILES = {path.stem: json.loads(path.read_text()) for path in sorted(CORPUS.glob("*.json"))}


def cases(families: list[str]) -> list[Any]:
    return [
        pytest.param(family, case, id=f"{family}: {case['name']}")
        for family in families
        for case in FILES[family]["cases"]
    ]


CASES = cases(list(FILES))
# The cases of the families mlx-lm has a parser for, read by it too.
COMPARED = cases([family for family, corpus in FILES.items() if corpus["mlx_lm_parser"]])


def pieces_of(text: str) -> list[list[str]]:
    """The ways a case's output is split: whole, a character at a time, in pairs, and in
    seeded random pieces (as a tokenizer might cut markers)."""
    rng = random.Random(text)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, len(text) // 4)))
    bounds = list(zip([0, *cuts], [*cuts, len(text)], strict=True))
    return [
        [text],
        list(text),
        [text[i : i + 2] for i in range(0, len(text), 2)],
        [text[a:b] for a, b in bounds],
    ]


def use(family: str) -> ToolUse:
    return ToolUse(tools=[ChatTool.model_validate(t) for t in FILES[family]["tools"]])


def readings(got: Scanned) -> list[dict[str, Any]] | str:
    """The calls as the corpus writes them ("text": none); arguments that are not JSON are
    recorded as `arguments_text`."""
    if not got.calls:
        return "text"
    found: list[dict[str, Any]] = []
    for call in got.calls:
        try:
            found.append(
                {"name": call.function.name, "arguments": json.loads(call.function.arguments)}
            )
        except ValueError:
            found.append({"name": call.function.name, "arguments_text": call.function.arguments})
    return found


def expected(case: dict[str, Any]) -> list[dict[str, Any]] | str:
    calls = case["calls"]
    return (
        calls
        if calls == "text"
        else [{"name": c["name"], "arguments": c["arguments"]} for c in calls]
    )


def syntax_format(syntax: CallSyntax) -> ToolFormat:
    return ToolFormat(in_template=True, syntax=syntax)


def own_syntax(family: str) -> CallSyntax:
    module = importlib.import_module(f"worker.engine.sequence.calls.families.{family}")
    syntax: CallSyntax = module.SYNTAX
    return syntax


@pytest.mark.parametrize(("family", "case"), CASES)
def test_each_case_is_read_as_the_corpus_says_however_the_output_is_split(
    family: str, case: dict[str, Any]
) -> None:
    form = syntax_format(own_syntax(family))
    for pieces in pieces_of(case["output"]):
        scanner = form.scanner(use(family))
        got = scanned(scanner, pieces)
        assert readings(got) == expected(case), pieces
        assert got.text == (case["output"] if case["calls"] == "text" else case["shown"])
        assert scanner.made == len(got.calls)  # no call made: finish_reason stays "stop"


@pytest.mark.parametrize(("family", "case"), CASES)
def test_each_calls_streamed_pieces_add_up_to_it(family: str, case: dict[str, Any]) -> None:
    got = scanned(syntax_format(own_syntax(family)).scanner(use(family)), list(case["output"]))
    assert len({d.index for d in got.deltas}) == len(got.calls)
    for index, call in enumerate(got.calls):
        mine = [d for d in got.deltas if d.index == index]
        assert (mine[0].id, mine[0].function.name) == (call.id, call.function.name)
        assert all(d.id is None and d.function.name is None for d in mine[1:])
        assert "".join(d.function.arguments for d in mine) == call.function.arguments


@pytest.mark.parametrize(("family", "case"), COMPARED)
def test_mlx_lms_parser_reads_each_case_as_the_corpus_records(
    family: str, case: dict[str, Any]
) -> None:
    syntax = module_syntax(FILES[family]["mlx_lm_parser"])
    got = scanned(syntax_format(syntax).scanner(use(family)), [case["output"]])
    record = case["mlx_lm"]
    assert readings(got) == (expected(case) if record == "same" else record["reads"])


class TemplateOnly:
    """A tokenizer as mlx-lm's loader leaves it, for a chat template alone: the tool parser
    mlx-lm infers from the template, as `mlx_lm.tokenizer_utils.load` sets it up."""

    def __init__(self, template: str):
        self.chat_template = template
        inferred = _infer_tool_parser(self)
        module = importlib.import_module(f"mlx_lm.tool_parsers.{inferred}") if inferred else None
        self.has_tool_calling = module is not None
        self.tool_parser = module.parse_tool_call if module else None
        self.tool_call_start = module.tool_call_start if module else None
        self.tool_call_end = module.tool_call_end if module else None

    def get_vocab(self) -> dict[str, int]:
        return {}


@pytest.mark.parametrize("family", FILES)
def test_a_model_whose_template_marks_the_family_reads_calls_in_its_syntax(family: str) -> None:
    corpus = FILES[family]
    tokenizer = TemplateOnly(corpus["template"])
    assert _infer_tool_parser(tokenizer) == corpus["mlx_lm_parser"]
    form = ToolFormat.of(tokenizer)
    assert (form.family, form.in_template) == (family, True)
