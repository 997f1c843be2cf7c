"""What mlx-lm makes of each family's real tokenizer (thinking markers, tool parser), and what
the families' chat templates (tests/families/data/) render, through mlx-lm's own
`apply_chat_template` as the worker calls it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mlx_lm.tool_parsers import json_tools, mistral

from tests.families.examples import TOOL_ARGUMENTS
from tests.families.vocab import FAMILIES, deepseek, family_tokenizer

HI = [{"role": "user", "content": "hi"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}

# family -> (think start, think end: their ids or None, the tool parser mlx-lm picks or None)
INFERRED: dict[str, tuple[tuple[int, ...] | None, tuple[int, ...] | None, Any]] = {
    "qwen3": ((151667,), (151668,), json_tools),
    "deepseek-r1": ((128821,), (128822,), None),
    # mlx-lm knows no harmony markers: gpt-oss's analysis channel is not "thinking" to it.
    "gpt-oss": (None, None, None),
    "llama3": (None, None, None),
    "phi4-mini": (None, None, None),
    "gemma": (None, None, None),
    "mistral": (None, None, mistral),
}


def render(family: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    rendered: str = family_tokenizer(family).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **kwargs
    )
    return rendered


def test_every_family_has_its_inference_stated() -> None:
    assert set(INFERRED) == set(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_mlx_lm_infers_each_familys_thinking_markers_and_tool_parser(family: str) -> None:
    tokenizer = family_tokenizer(family)
    start, end, parser = INFERRED[family]
    assert tokenizer.has_thinking == (start is not None)
    assert tokenizer.think_start_tokens == start
    assert tokenizer.think_end_tokens == end
    if start is not None:
        assert (tokenizer.think_start, tokenizer.think_end) == ("<think>", "</think>")
    assert tokenizer.tool_parser is (parser.parse_tool_call if parser else None)
    if parser is not None:
        assert tokenizer.tool_call_start == parser.tool_call_start


def test_qwen3_renders_chatml_and_thinks_unless_told_not_to() -> None:
    assert render("qwen3", HI) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert render("qwen3", HI, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_qwen3_renders_reasoning_of_the_current_turn_only() -> None:
    messages = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "A", "reasoning_content": "old"},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "", "reasoning_content": "new", "tool_calls": [CALL]},
        {"role": "tool", "content": "sunny"},
    ]
    text = render("qwen3", messages)
    assert "old" not in text
    assert "<|im_start|>assistant\n<think>\nnew\n</think>\n\n<tool_call>" in text
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>" in text


def test_qwen3_tool_call_as_rendered_is_what_mlx_lms_parser_reads() -> None:
    call = {**CALL, "function": {"name": "get_weather", "arguments": TOOL_ARGUMENTS}}
    text = render("qwen3", [*HI, {"role": "assistant", "content": "", "tool_calls": [call]}])
    inside = text.split("<tool_call>")[1].split("</tool_call>")[0]
    assert json_tools.parse_tool_call(inside) == {
        "name": "get_weather",
        "arguments": json.loads(TOOL_ARGUMENTS),
    }
    assert "# Tools" in render("qwen3", HI, tools=TOOLS)


def test_gpt_oss_states_its_reasoning_level_medium_unless_asked() -> None:
    assert "\nReasoning: medium\n" in render("gpt-oss", HI)
    assert "\nReasoning: high\n" in render("gpt-oss", HI, reasoning_effort="high")
    assert render("gpt-oss", HI).endswith("<|start|>user<|message|>hi<|end|><|start|>assistant")


def test_gpt_oss_renders_tools_calls_and_thinking_in_harmony() -> None:
    messages = [
        *HI,
        {"role": "assistant", "content": "", "thinking": "Need it.", "tool_calls": [CALL]},
        {"role": "tool", "content": "sunny"},
    ]
    text = render("gpt-oss", messages, tools=TOOLS)
    assert "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {" in text
    assert (
        "<|start|>assistant<|channel|>analysis<|message|>Need it.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        "<|message|>{}<|call|>"
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny<|end|>"
    ) in text


def test_deepseek_r1_prompt_ends_inside_reasoning() -> None:
    text = render("deepseek-r1", HI)
    assert text == deepseek("begin of sentence") + deepseek("User") + "hi" + (
        deepseek("Assistant") + "<think>\n"
    )
    tokenizer = family_tokenizer("deepseek-r1")
    tokens = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.rfind_think_start(tokens) > tokenizer.rfind_think_end(tokens)


def test_llama3_renders_headers_and_one_begin_of_text() -> None:
    tokenizer = family_tokenizer("llama3")
    tokens = tokenizer.apply_chat_template(HI, add_generation_prompt=True)
    assert tokens.count(128000) == 1
    assert tokenizer.decode(tokens) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert "Environment: ipython\n" in render("llama3", HI, tools=TOOLS)


def test_gemma_folds_the_system_message_into_the_first_turn() -> None:
    messages = [{"role": "system", "content": "Be brief."}, *HI]
    assert render("gemma", messages) == (
        "<bos><start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n<start_of_turn>model\n"
    )


def test_mistral_renders_inst_turns_and_tool_calls_its_parser_reads() -> None:
    call = {**CALL, "function": {"name": "get_weather", "arguments": TOOL_ARGUMENTS}}
    messages = [*HI, {"role": "assistant", "content": "", "tool_calls": [call]}]
    text = render("mistral", messages, tools=TOOLS)
    assert text.startswith("<s>[AVAILABLE_TOOLS][")
    assert "[/AVAILABLE_TOOLS][INST]hi[/INST][TOOL_CALLS][" in text
    assert text.endswith("</s>")
    after = text.split("[TOOL_CALLS]")[1].removesuffix("</s>")
    assert mistral.parse_tool_call(after) == {
        "name": "get_weather",
        "arguments": json.loads(TOOL_ARGUMENTS),
    }
    assert render("mistral", HI) == "<s>[INST]hi[/INST]"


def test_phi4_mini_renders_role_tokens() -> None:
    assert render("phi4-mini", HI) == "<|user|>hi<|end|><|assistant|>"
