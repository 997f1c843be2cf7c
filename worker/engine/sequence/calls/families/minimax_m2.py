"""MiniMax M2 and M2.1: invoke elements in a `<minimax:tool_call>` wrapper.

Markers:

    <minimax:tool_call>
    <invoke name="NAME">
    <parameter name="KEY">VALUE</parameter>
    </invoke>
    </minimax:tool_call>

How it is read, and what it tolerates: families/invokes.py (every invoke in the wrapper is a
call; values coerced by the tool's schema; a literal `</parameter>` inside a value kept).

mlx-lm's `minimax_m2` parser takes the first `</parameter>` (truncating such a value) and
gives a list for parallel calls, which mlxq's reader of mlx-lm parsers took for no call: this
module replaces it.

Forced calls: not written in this syntax yet.
"""

from __future__ import annotations

from worker.engine.sequence.calls.call_readers import ReadCall
from worker.engine.sequence.calls.families.invokes import read_invokes
from worker.engine.sequence.calls.families.syntax import CallSyntax, Opening, Tools

WRAPPER, WRAPPER_END = "<minimax:tool_call>", "</minimax:tool_call>"


def parse(text: str, tools: Tools) -> list[ReadCall]:
    return read_invokes(text, tools)


SYNTAX = CallSyntax(name="minimax_m2", openings=(Opening(WRAPPER, WRAPPER_END),), parse=parse)
