"""Replies in each family's own format, for scripted models (tests/families/scripted.py): what
a model of the family writes after its chat template's generation prompt, end token included.

Keys are (family, what the reply shows). A test that needs another reply writes its own; these
are the ones tests/families/ checks a scripted model says exactly.
"""

from __future__ import annotations

from tests.families.vocab import deepseek

TOOL_ARGUMENTS = '{"city": "Paris"}'

REPLIES: dict[tuple[str, str], str] = {
    # Qwen3: reasoning in <think>, then a JSON tool call; the turn ends with <|im_end|>.
    ("qwen3", "think-then-tool-call"): (
        "<think>\nThe user wants the weather in Paris. I should call the tool.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": ' + TOOL_ARGUMENTS + "}\n</tool_call>"
        "<|im_end|>"
    ),
    ("qwen3", "think-then-answer"): (
        "<think>\nA greeting. I will greet back.\n</think>\n\nHello! How can I help?<|im_end|>"
    ),
    # gpt-oss (harmony): analysis, then the final answer ending with <|return|> ...
    ("gpt-oss", "analysis-then-final"): (
        "<|channel|>analysis<|message|>A greeting; answer briefly<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>"
    ),
    # ... or a tool call on the commentary channel ending with <|call|>.
    ("gpt-oss", "analysis-then-tool-call"): (
        "<|channel|>analysis<|message|>Need the weather; call get_weather<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        "<|message|>" + TOOL_ARGUMENTS + "<|call|>"
    ),
    # DeepSeek R1: the template pre-filled "<think>\n", so the reply starts inside reasoning.
    ("deepseek-r1", "inside-think-then-answer"): (
        "The user greets me in two languages.\n</think>\n\nHello! 你好 😀"
        + deepseek("end of sentence")
    ),
    # Llama 3.1: a turn ends with <|eot_id|>; a built-in tool call ends its message with
    # <|eom_id|>.
    ("llama3", "answer"): "Hello! How can I help you today?<|eot_id|>",
    ("llama3", "builtin-tool-call"): (
        '<|python_tag|>brave_search.call(query="weather in Paris")<|eom_id|>'
    ),
    # Llama 3.1-3.3: a custom tool's call is the whole answer, bare JSON with "parameters".
    ("llama3", "tool-call"): (
        '{"name": "get_weather", "parameters": ' + TOOL_ARGUMENTS + "}<|eot_id|>"
    ),
    ("phi4-mini", "answer"): "Hello! How can I help?<|end|>",
    ("gemma", "answer"): "Hello! How can I help? Ça va? 😀<end_of_turn>",
    ("mistral", "answer"): "Hello! How can I help?</s>",
    ("mistral", "tool-call"): (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": ' + TOOL_ARGUMENTS + "}]</s>"
    ),
}
