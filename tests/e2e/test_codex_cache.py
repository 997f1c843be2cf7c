"""A Codex-shaped session through OpenAI's SDK hits the worker's prefix cache on every turn:
`instructions` and the tools on each request, `store: false` (the whole history resent as
items), function calls and their outputs replayed, a `prompt_cache_key`."""

from __future__ import annotations

import secrets
from typing import Any

import openai

from tests.support import MODEL

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "shell",
        "description": "Run a shell command and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    }
]


def _step(step: int) -> list[Any]:
    """One agent step as Codex replays it: the call the model made, then its output."""
    call_id = f"call_{step:02d}"
    arguments = f'{{"command": "cat f{step}.py"}}'
    return [
        {"type": "function_call", "call_id": call_id, "name": "shell", "arguments": arguments},
        {"type": "function_call_output", "call_id": call_id, "output": f"def f{step}(): pass"},
    ]


def test_each_turn_of_a_codex_shaped_session_reads_the_whole_last_turn_from_the_cache(
    client: openai.OpenAI,
) -> None:
    instructions = f"You are coding agent {secrets.token_hex(4)}. " + " ".join(
        f"Rule {i}: read a file before you change it, and run its tests after." for i in range(12)
    )
    items: list[Any] = [{"role": "user", "content": "Fix the failing test."}]
    prompts, cached = [], []
    for step in range(5):
        response = client.responses.create(
            model=MODEL,
            instructions=instructions,
            input=items,
            tools=TOOLS,
            store=False,
            prompt_cache_key="session-1",
            max_output_tokens=2,
            temperature=0,
        )
        assert response.usage is not None
        cached.append(response.usage.input_tokens_details.cached_tokens)
        prompts.append(response.usage.input_tokens)
        items += _step(step)
    assert cached[0] < prompts[0] / 2  # the session's instructions are new
    assert all(cached[n] >= prompts[n - 1] for n in range(1, len(prompts))), (prompts, cached)
