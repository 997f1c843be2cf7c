"""Forced tool calls (tool_choice required or named) written in a family's own syntax:
Qwen3-Coder's XML, GLM's key/value tags, MiniMax M2's and DeepSeek DSML's invoke elements, and
Kimi K2's, DeepSeek V3.1's and Mistral's JSON arguments
(worker/engine/sequence/calls/families/frames.py).
The grammar takes a call as the family's template writes it, with values that follow the
tool's schema, and nothing else; what it takes, the family's parser reads back as the same
call; and on a real vocabulary it leads a call's tokens, its markers as the added tokens they
are, to the end token (Qwen3's for Qwen3-Coder, the JSON-tools frame and MiniMax, whose own
vocabulary is not on PyPI; DeepSeek's own for DSML; the Mistral stand-in for Mistral)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.wire.generation.tools import (
    ChatTool,
    FunctionChoice,
    FunctionDefinition,
    NamedToolChoice,
    ToolChoice,
    ToolUse,
    lark_text,
)
from tests.families.forcing import assert_forced_to_the_end, refused_at
from tests.families.vocab import deepseek as deepseek_marker
from tests.families.vocab import family_tokenizer
from tests.grammar_checks import takes
from worker.engine.sequence.calls.families import (
    deepseek_dsml,
    deepseek_v3,
    glm,
    kimi_k2,
    minimax_m2,
    mistral,
    qwen3_coder,
)
from worker.engine.sequence.calls.families.mlx_lm_parsers import module_syntax
from worker.engine.sequence.calls.families.syntax import CallSyntax
from worker.engine.sequence.calls.tool_calls import ToolFormat

SCHEMAS: dict[str, dict[str, Any]] = {
    "get_weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
        },
        "required": ["city"],
    },
    "set_volume": {
        "type": "object",
        "properties": {"level": {"type": "integer"}, "muted": {"type": "boolean"}},
        "required": ["level", "muted"],
    },
    "get_time": {"type": "object", "properties": {}},
}
TOOLS = [
    ChatTool(type="function", function=FunctionDefinition(name=n, parameters=s))
    for n, s in SCHEMAS.items()
]
NAMED = NamedToolChoice(type="function", function=FunctionChoice(name="set_volume"))


def qwen(name: str, *params: tuple[str, str]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def glm_call(name: str, *params: tuple[str, str]) -> str:
    body = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in params)
    return f"<tool_call>{name}{body}</tool_call>"


def json_args(params: tuple[tuple[str, str], ...]) -> str:
    """Written values as the JSON object a JSON-arguments family writes (json.dumps' form)."""
    return json.dumps({k: _json_or_text(v) for k, v in params}, ensure_ascii=False)


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def kimi(name: str, *params: tuple[str, str]) -> str:
    call = (
        f"{kimi_k2.CALL}functions.{name}:0{kimi_k2.ARGUMENTS}{json_args(params)}{kimi_k2.CALL_END}"
    )
    return f"{kimi_k2.SECTION}{call}{kimi_k2.SECTION_END}"


def deepseek(name: str, *params: tuple[str, str]) -> str:
    call = (
        f"{deepseek_v3.CALL}{name}{deepseek_v3.SEPARATOR}{json_args(params)}{deepseek_v3.CALL_END}"
    )
    return f"{deepseek_v3.SECTION}{call}{deepseek_v3.SECTION_END}"


def mistral_call(name: str, *params: tuple[str, str]) -> str:
    return f"[TOOL_CALLS]{name}[ARGS]{json_args(params)}"


def minimax(name: str, *params: tuple[str, str]) -> str:
    body = "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in params)
    call = f'<invoke name="{name}">\n{body}</invoke>\n'
    return f"{minimax_m2.WRAPPER}\n{call}{minimax_m2.WRAPPER_END}"


def dsml(name: str, *params: tuple[str, str], string: dict[str, str] | None = None) -> str:
    """As V3.2's encoder writes a call: `string="true"` where the value is a string (the
    schema's type; `string` overrides it per key), else "false"."""
    properties = SCHEMAS.get(name, {}).get("properties", {})
    prefix = deepseek_dsml.PREFIX
    body = ""
    for key, value in params:
        text = properties.get(key, {}).get("type") == "string"
        marked = (string or {}).get(key, "true" if text else "false")
        body += f'<{prefix}parameter name="{key}" string="{marked}">{value}</{prefix}parameter>\n'
    call = f'<{prefix}invoke name="{name}">\n{body}</{prefix}invoke>\n'
    return f"{deepseek_dsml.WRAPPER}\n{call}{deepseek_dsml.WRAPPER_END}"


WRITERS = {
    "qwen3_coder": (qwen3_coder.SYNTAX, qwen),
    "glm": (glm.SYNTAX, glm_call),
    "kimi_k2": (kimi_k2.SYNTAX, kimi),
    "deepseek_v3": (deepseek_v3.SYNTAX, deepseek),
    "mistral": (mistral.SYNTAX, mistral_call),
    "minimax_m2": (minimax_m2.SYNTAX, minimax),
    "deepseek_dsml": (deepseek_dsml.SYNTAX, dsml),
}
# How two calls are joined: one wrapper each, or (sections) two calls in one section.
JOINED = {
    "kimi_k2": lambda a, b: a.removesuffix(kimi_k2.SECTION_END) + b.removeprefix(kimi_k2.SECTION),
    "deepseek_v3": lambda a, b: (
        a.removesuffix(deepseek_v3.SECTION_END) + b.removeprefix(deepseek_v3.SECTION)
    ),
    "mistral": lambda a, b: a + b,
    "minimax_m2": lambda a, b: (
        a.removesuffix(minimax_m2.WRAPPER_END) + b.removeprefix(minimax_m2.WRAPPER + "\n")
    ),
    "deepseek_dsml": lambda a, b: (
        a.removesuffix(deepseek_dsml.WRAPPER_END) + b.removeprefix(deepseek_dsml.WRAPPER + "\n")
    ),
}


def joined(family: str, a: str, b: str) -> str:
    return JOINED[family](a, b) if family in JOINED else f"{a}\n{b}"


def accepts(
    syntax: CallSyntax, choice: ToolChoice, text: str, tools: list[ChatTool] = TOOLS
) -> bool:
    assert syntax.grammar is not None
    return takes(syntax.grammar(ToolUse(tools=tools, choice=choice), {}), text)


def read_back(syntax: CallSyntax, text: str) -> list[tuple[str, Any]]:
    form = ToolFormat(in_template=True, syntax=syntax)
    scanner = form.scanner(ToolUse(tools=TOOLS))
    calls = [*scanner.feed(text).calls, *scanner.finish().calls]
    return [(c.function.name, json.loads(c.function.arguments)) for c in calls]


@pytest.mark.parametrize("family", WRITERS)
def test_a_forced_call_as_the_template_writes_it_is_taken_and_read_back_the_same(
    family: str,
) -> None:
    syntax, write = WRITERS[family]
    weather = write("get_weather", ("city", "São Paulo </div>\nnorth"), ("days", "3"))
    volume = write("set_volume", ("level", "7"), ("muted", "true"))
    for text, expected in [
        (weather, [("get_weather", {"city": "São Paulo </div>\nnorth", "days": 3})]),
        (volume, [("set_volume", {"level": 7, "muted": True})]),
        (write("get_time"), [("get_time", {})]),
        (write("get_weather", ("city", "Oslo"), ("unit", "celsius")), None),
        (joined(family, weather, volume), None),
    ]:
        assert accepts(syntax, "required", text), text
        if expected is not None:
            assert read_back(syntax, text) == expected


@pytest.mark.parametrize("family", WRITERS)
def test_a_forced_call_whose_values_break_the_schema_is_not_taken(family: str) -> None:
    syntax, write = WRITERS[family]
    for text in [
        write("get_weather", ("city", "Paris"), ("days", "three")),  # not an integer
        write("get_weather", ("city", "Paris"), ("unit", "kelvin")),  # not in the enum
        write("set_volume", ("level", "7")),  # a required parameter left out
        write("delete_everything"),  # no such tool
        "Sure! " + write("get_time"),  # text before the call
    ]:
        assert not accepts(syntax, "required", text), text


@pytest.mark.parametrize("family", WRITERS)
def test_a_named_forced_call_is_that_one_call(family: str) -> None:
    syntax, write = WRITERS[family]
    volume = write("set_volume", ("level", "1"), ("muted", "false"))
    assert accepts(syntax, NAMED, volume)
    assert not accepts(syntax, NAMED, write("get_time"))
    assert not accepts(syntax, NAMED, joined(family, volume, volume))


def test_a_dsml_parameter_says_how_its_value_is_written_as_its_schema_has_it() -> None:
    syntax = deepseek_dsml.SYNTAX
    assert accepts(syntax, "required", dsml("get_weather", ("city", "Oslo"), ("days", "3")))
    for text in [
        dsml("get_weather", ("city", "Oslo"), ("days", "3"), string={"days": "true"}),
        dsml("get_weather", ("city", '"Oslo"'), string={"city": "false"}),
        dsml("get_weather", ("city", "Oslo"), ("unit", "celsius"), string={"unit": "false"}),
    ]:
        assert not accepts(syntax, "required", text), text
    # An enum of strings that names no type is text too.
    modes = {"type": "object", "properties": {"mode": {"enum": ["fast", "slow"]}}}
    run = [ChatTool(type="function", function=FunctionDefinition(name="run", parameters=modes))]
    for marked, taken in [("true", True), ("false", False)]:
        text = dsml("run", ("mode", "fast"), string={"mode": marked})
        assert accepts(syntax, "required", text, run) is taken, text


def test_a_family_whose_syntax_has_no_grammar_cannot_be_forced() -> None:
    # mlx-lm's parsers (Gemma 4's here) come with no grammar: a forced call is refused.
    form = ToolFormat(in_template=True, syntax=module_syntax("gemma4"))
    assert form.call_grammar(ToolUse(tools=TOOLS, choice="required")) is None


def test_a_marker_held_as_one_token_is_forced_as_it_the_longest_first_white_space_free() -> None:
    tokens = {"<tool": 3, "<tool_call>": 7, "\n": 5}
    assert lark_text("<tool_call>\n<function=", tokens) == '<[7]> "\\n<function="'
    assert lark_text("<tool_call>", {}) == '"<tool_call>"'


def test_a_forced_call_on_qwen3s_real_vocabulary_takes_the_calls_tokens_then_ends() -> None:
    # Qwen3's <tool_call> and </tool_call> are added tokens: the grammar writes them as such.
    added = family_tokenizer("qwen3").get_added_vocab()
    form = ToolFormat(in_template=True, syntax=qwen3_coder.SYNTAX, tokens=added)
    grammar = form.call_grammar(ToolUse(tools=TOOLS, choice=NAMED))
    assert_forced_to_the_end(grammar, qwen("set_volume", ("level", "4"), ("muted", "false")))


def test_a_forced_json_tools_call_on_qwen3s_real_vocabulary_takes_its_marker_tokens() -> None:
    form = ToolFormat.of(family_tokenizer("qwen3"))
    grammar = form.call_grammar(ToolUse(tools=TOOLS, choice=NAMED))
    call = '{"name": "set_volume", "arguments": {"level": 4, "muted": false}}'
    assert_forced_to_the_end(grammar, f"<tool_call>{call}</tool_call>")


def test_a_forced_mistral_call_takes_its_tool_calls_token_on_the_familys_vocabulary() -> None:
    form = ToolFormat.of(family_tokenizer("mistral"))
    grammar = form.call_grammar(ToolUse(tools=TOOLS, choice=NAMED))
    call = mistral_call("set_volume", ("level", "4"), ("muted", "false"))
    assert_forced_to_the_end(grammar, call, family="mistral", end_token="</s>")


def test_a_forced_minimax_call_on_qwen3s_vocabulary_takes_the_calls_tokens_then_ends() -> None:
    # MiniMax's vocabulary is not on PyPI; on Qwen3's, its markers are text in several tokens.
    added = family_tokenizer("qwen3").get_added_vocab()
    form = ToolFormat(in_template=True, syntax=minimax_m2.SYNTAX, tokens=added)
    grammar = form.call_grammar(ToolUse(tools=TOOLS, choice="required"))
    weather = minimax("get_weather", ("city", "Oslo"), ("days", "2"))
    volume = minimax("set_volume", ("level", "4"), ("muted", "false"))
    assert_forced_to_the_end(grammar, joined("minimax_m2", weather, volume))


def test_a_forced_dsml_call_on_deepseeks_real_vocabulary_takes_the_calls_tokens_then_ends() -> None:
    # DeepSeek's vocabulary holds the `|DSML|` prefix (fullwidth bars) as one added token.
    tokenizer = family_tokenizer("deepseek-r1")
    form = ToolFormat(
        in_template=True, syntax=deepseek_dsml.SYNTAX, tokens=tokenizer.get_added_vocab()
    )
    grammar = form.call_grammar(ToolUse(tools=TOOLS, choice="required"))
    weather = dsml("get_weather", ("city", "Oslo </b>"), ("days", "2"))
    volume = dsml("set_volume", ("level", "4"), ("muted", "false"))
    calls = joined("deepseek_dsml", weather, volume)
    marker = tokenizer.convert_tokens_to_ids(deepseek_dsml.PREFIX)
    assert marker in tokenizer.encode(calls, add_special_tokens=False)
    end = deepseek_marker("end of sentence")
    assert_forced_to_the_end(grammar, calls, family="deepseek-r1", end_token=end)
    # A value ends at its first closer, as the parser reads it: no more of it after that.
    closer = f"</{deepseek_dsml.PREFIX}parameter>\n"
    overrun = calls.replace(closer, closer + "more" + closer, 1)
    refused = refused_at(grammar, overrun, "deepseek-r1", end)
    assert refused is not None
    assert refused.startswith(calls[: calls.index(closer) + len(closer) - 1])
