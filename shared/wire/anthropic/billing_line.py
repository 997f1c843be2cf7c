"""Claude Code's billing line, kept out of the prompt.

Claude Code (2.1.36 and later) opens the first block of a /v1/messages `system` with
`x-anthropic-billing-header: cc_version=<version>; cc_entrypoint=<entrypoint>; cch=<5 hex>;`
and draws a new `cch` for every request. Left in, it changes the prompt's opening tokens on
every turn, and the worker's prefix cache, which reuses a repeated opening, then matches
nothing after them: a whole session is prefilled again each turn.

The rule: where the first line of the first system block is exactly that line, the line and its
line break are removed before the prompt is rendered, so the prompt, count_tokens and the cache
all see the same text; a block that held only the line is dropped. The line anywhere else, or
in any other form, is the client's text and is kept as sent.
"""

from __future__ import annotations

import re

from shared.wire.anthropic.message_blocks import TextBlock, joined

BILLING_LINE = re.compile(
    r"x-anthropic-billing-header: cc_version=[^;\s]+; cc_entrypoint=[^;\s]+; "
    r"cch=[0-9a-fA-F]{5};[ \t]*(?:\r?\n|\Z)"
)


def without_billing_line(text: str) -> str:
    """`text` less a billing line at its very start."""
    found = BILLING_LINE.match(text)
    return text[found.end() :] if found else text


def system_text(system: str | list[TextBlock]) -> str:
    """A request's `system` (a string, or text blocks joined) as the prompt's system message."""
    if isinstance(system, str):
        return without_billing_line(system)
    if not system:
        return ""
    first, *rest = system
    return without_billing_line(first.text) + joined(rest)
