"""Numbers a client writes as strings: the one rule for reading them.

A JSON object's keys (`logit_bias`), query parameters, form fields and headers carry numbers as
text. Python's `str.isdigit` and `int` accept far more than ASCII: `"²".isdigit()` is true and
`int("²")` then raises (a 500), `int("١٢")` is 12 (a token id the client never wrote), and
`int` and pydantic's lax mode take `+3`, `3_600`, ` 3 ` and `3.0`. So every such number is read
here, and only an optional `-` and ASCII digits are one.
"""

from __future__ import annotations

import re

# At most 18 digits: any such number fits a signed 64-bit integer (Redis's, Lua's).
_INTEGER = re.compile(r"-?[0-9]{1,18}")


def parse_integer(text: str, *, signed: bool = False, max_digits: int = 18) -> int | None:
    """The integer `text` writes in ASCII decimal digits, with a leading `-` only when `signed`;
    None when it writes anything else (other scripts' digits, `+`, `_`, spaces, a fraction) or
    has more than `max_digits` digits."""
    if not _INTEGER.fullmatch(text) or (text.startswith("-") and not signed):
        return None
    if len(text.removeprefix("-")) > max_digits:
        return None
    return int(text)
