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

Forced calls (tool_choice required or named) are written in this syntax, as the template
writes a call (families/invokes.py): one wrapper around all calls, each invoke and parameter
on its own line; string values free text up to `</parameter>`, others JSON of their schema.
"""

from __future__ import annotations

from worker.engine.sequence.calls.call_readers import ReadCall
from worker.engine.sequence.calls.families.invokes import invoke_frame, read_invokes
from worker.engine.sequence.calls.families.syntax import CallSyntax, Opening, Tools

WRAPPER, WRAPPER_END = "<minimax:tool_call>", "</minimax:tool_call>"


def parse(text: str, tools: Tools) -> list[ReadCall]:
    return read_invokes(text, tools)


FRAME = invoke_frame(WRAPPER, WRAPPER_END)


SYNTAX = CallSyntax(
    name="minimax_m2",
    openings=(Opening(WRAPPER, WRAPPER_END),),
    parse=parse,
    grammar=FRAME.grammar,
)
