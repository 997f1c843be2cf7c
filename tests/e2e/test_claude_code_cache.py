"""A Claude Code session through Anthropic's SDK hits the worker's prefix cache from turn 2,
although each of its requests opens its system prompt with a new billing nonce
(shared/wire/billing_line.py)."""

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
