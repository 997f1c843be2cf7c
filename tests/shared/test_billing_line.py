"""Claude Code's billing line (shared/wire/anthropic/billing_line.py): removed from the first system
block of a /v1/messages request in exactly its form, kept everywhere else."""

from __future__ import annotations

from typing import Any

import pytest

from shared.wire.anthropic.billing_line import without_billing_line
from shared.wire.anthropic.messages import MessagesInput

LINE = "x-anthropic-billing-header: cc_version=2.1.37.3a1; cc_entrypoint=cli; cch=9f0c2;"
PROMPT = "You are Claude Code, Anthropic's official CLI for Claude."


def _system_prompt(system: Any) -> str:
    request = MessagesInput(model="m", system=system, messages=[{"role": "user", "content": "hi"}])
    first = request.chat_messages()[0]
    assert first.role == "system"
    return first.text()


def test_a_first_block_that_is_the_billing_line_is_dropped() -> None:
    blocks = [{"type": "text", "text": LINE}, {"type": "text", "text": PROMPT}]
    assert _system_prompt(blocks) == PROMPT


def test_the_billing_line_opening_a_block_or_a_string_is_removed_with_its_line_break() -> None:
    assert _system_prompt([{"type": "text", "text": f"{LINE}\n{PROMPT}"}]) == PROMPT
    assert _system_prompt(f"{LINE}\r\n{PROMPT}") == PROMPT


def test_two_requests_differing_only_in_the_nonce_render_the_same_system_prompt() -> None:
    other = LINE.replace("cch=9f0c2", "cch=04ab7")
    assert _system_prompt(f"{LINE}\n{PROMPT}") == _system_prompt(f"{other}\n{PROMPT}")


@pytest.mark.parametrize(
    "text",
    [
        f"{PROMPT}\n{LINE}",  # not the first line
        f" {LINE}\n{PROMPT}",  # not at the very start
        LINE.replace("cch=9f0c2", "cch=9f0c"),  # four hex digits
        LINE.replace("cch=9f0c2", "cch=9f0cz"),  # not hex
        LINE.replace("cc_entrypoint=cli; ", ""),  # a field missing
        LINE.rstrip(";"),  # no closing semicolon
        LINE + " more text on the same line",
    ],
)
def test_any_other_form_or_place_of_the_line_is_kept_as_sent(text: str) -> None:
    assert without_billing_line(text) == text


def test_the_line_in_a_later_block_is_kept() -> None:
    blocks = [{"type": "text", "text": PROMPT}, {"type": "text", "text": LINE}]
    assert _system_prompt(blocks) == PROMPT + LINE
