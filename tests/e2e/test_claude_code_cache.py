"""A Claude Code session through Anthropic's SDK hits the worker's prefix cache from turn 2,
although each of its requests opens its system prompt with a new billing nonce
(shared/wire/anthropic/billing_line.py)."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.support import MODEL

GREEDY = {"temperature": 0}  # the current SDK has no temperature argument


@pytest.fixture(scope="module")
def claude(api_url: str, worker_process: subprocess.Popen[bytes]) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=api_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def _system(prompt: str) -> list[Any]:
    """Claude Code's system blocks: the billing line with this request's own nonce, then the
    session's system prompt."""
    billing = (
        "x-anthropic-billing-header: cc_version=2.1.37.4c1; cc_entrypoint=cli; "
        f"cch={secrets.token_hex(3)[:5]};"
    )
    return [{"type": "text", "text": billing}, {"type": "text", "text": prompt}]


def test_a_turn_that_differs_only_by_its_billing_nonce_reads_the_last_turn_from_the_cache(
    claude: anthropic.Anthropic,
) -> None:
    # A system prompt no other test sends, so that only this test's turns can be cached.
    prompt = (
        f"You are coding assistant {secrets.token_hex(4)}. You help with software tasks in "
        "a terminal. Answer briefly, in one sentence, and never use more words than needed."
    )
    turn: list[Any] = [{"role": "user", "content": "Say hello."}]
    first = claude.messages.create(
        model=MODEL, max_tokens=8, system=_system(prompt), messages=turn, extra_body=GREEDY
    )
    answer = "".join(block.text for block in first.content if block.type == "text")
    turn += [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Now say goodbye."},
    ]
    second = claude.messages.create(
        model=MODEL, max_tokens=4, system=_system(prompt), messages=turn, extra_body=GREEDY
    )
    first_prompt = first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)
    # The whole of the first turn's prompt (with the nonce left in, only the tokens before it).
    assert (second.usage.cache_read_input_tokens or 0) >= first_prompt


TOOLS: list[Any] = [
    {
        "name": name,
        "description": description,
        "input_schema": {
            "type": "object",
            "properties": {field: {"type": "string"}},
            "required": [field],
        },
    }
    for name, description, field in [
        ("Read", "Read a file from the local filesystem.", "file_path"),
        ("Edit", "Replace a string in a file.", "new_string"),
        ("Bash", "Run a shell command and return its output.", "command"),
    ]
]


def _long_prompt() -> str:
    """A system prompt of about 500 tokens, standing for Claude Code's 15-20k (kept short for
    a CPU's prefill: with a 3,500-token one each turn from the second read 98% from the cache)."""
    rules = [
        f"Rule {i}: before you change file number {i}, read it, keep its style, run its tests "
        "and say in one line what you changed and why."
        for i in range(12)
    ]
    return f"You are coding assistant {secrets.token_hex(4)}.\n" + "\n".join(rules)


def _turn(step: int) -> list[Any]:
    """One agent step as Claude Code replays it: the assistant's thinking, text and tool call,
    then the user's tool result."""
    use_id = f"toolu_{step:02d}"
    assistant = [
        {"type": "thinking", "thinking": f"Step {step}: read the file.", "signature": "sig"},
        {"type": "text", "text": f"I will look at file {step}."},
        {"type": "tool_use", "id": use_id, "name": "Read", "input": {"file_path": f"f{step}.py"}},
    ]
    result = {"type": "tool_result", "tool_use_id": use_id, "content": f"def f{step}(): pass"}
    return [{"role": "assistant", "content": assistant}, {"role": "user", "content": [result]}]


def test_each_turn_of_a_claude_code_shaped_session_reads_the_whole_last_turn_from_the_cache(
    claude: anthropic.Anthropic,
) -> None:
    """Tools, thinking blocks replayed, tool results, and a new billing nonce every turn."""
    prompt = _long_prompt()
    messages: list[Any] = [{"role": "user", "content": "Fix the failing test."}]
    prompts, cached = [], []
    for step in range(5):
        reply = claude.messages.create(
            model=MODEL,
            max_tokens=2,
            system=_system(prompt),
            tools=TOOLS,
            messages=messages,
            extra_body=GREEDY,
        )
        cached.append(reply.usage.cache_read_input_tokens or 0)
        prompts.append(reply.usage.input_tokens + cached[-1])
        messages += _turn(step)
    assert cached[0] < prompts[0] / 2  # the session's system prompt is new
    assert all(cached[n] >= prompts[n - 1] for n in range(1, len(prompts))), (prompts, cached)
