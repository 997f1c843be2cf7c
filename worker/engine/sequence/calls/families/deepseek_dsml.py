"""DeepSeek V3.2's DSML: invoke elements whose tags carry a `|DSML|` prefix (written here with
`|` where the model writes fullwidth bars, U+FF5C).

Markers:

    <|DSML|function_calls>
    <|DSML|invoke name="NAME">
    <|DSML|parameter name="KEY" string="true">VALUE</|DSML|parameter>
    </|DSML|invoke>
    </|DSML|function_calls>

`string="true"` says the value is the text as written, `string="false"` that it is JSON. How
it is read, and what it tolerates: families/invokes.py. mlx-lm has no parser for it.

The family is told apart by its template naming `<|DSML|function_calls>`.

Forced calls (tool_choice required or named) are written in this syntax, as V3.2's encoder
writes a call (families/invokes.py): one `function_calls` block around all calls, each invoke
and parameter on its own line; string values `string="true"` and free text up to the
parameter's closer, others `string="false"` and JSON of their schema.
"""

from __future__ import annotations

from worker.engine.sequence.calls.call_readers import ReadCall
from worker.engine.sequence.calls.families.invokes import invoke_frame, read_invokes
from worker.engine.sequence.calls.families.syntax import CallSyntax, Opening, Tools

PREFIX = "\uff5cDSML\uff5c"
WRAPPER, WRAPPER_END = f"<{PREFIX}function_calls>", f"</{PREFIX}function_calls>"


def parse(text: str, tools: Tools) -> list[ReadCall]:
    return read_invokes(text, tools, PREFIX)


def writes_this(template: str | None) -> bool:
    """Whether a chat template writes DSML calls."""
    return template is not None and WRAPPER in template


FRAME = invoke_frame(WRAPPER, WRAPPER_END, PREFIX, marked=True)


SYNTAX = CallSyntax(
    name="deepseek_dsml",
    openings=(Opening(WRAPPER, WRAPPER_END),),
    parse=parse,
    grammar=FRAME.grammar,
)
