"""Calls written as `<invoke name="NAME">` elements with
`<parameter name="KEY">VALUE</parameter>` children, which MiniMax M2 (families/minimax_m2.py)
and DeepSeek V3.2's DSML (families/deepseek_dsml.py) both write, the latter with a `|DSML|`
prefix (fullwidth bars) on every tag.

How it is read: each invoke is a call, each parameter one of its arguments. A value is coerced
by the tool's schema (families/values.py), unless the parameter says how it is written (DSML's
`string="true"`: the text as it is; `string="false"`: JSON, or the schema's reading where it is
not JSON).

How a forced call is written (`invoke_frame`): as both families' templates write a call, one
wrapper around all calls, each invoke and each parameter on its own line.

Malformations tolerated: a literal `</parameter>` inside a value (a parameter ends at the last
closer before the next parameter or the invoke's end, and only a `<parameter` that follows a
closed one starts a new one), names quoted with `'` or not at all, a call cut short by the end
token (a missing closer is taken as written).
"""

from __future__ import annotations

import json
import re
from typing import Any

from worker.engine.sequence.calls.call_readers import ReadCall
from worker.engine.sequence.calls.families.frames import XmlFrame
from worker.engine.sequence.calls.families.syntax import (
    CallSyntaxError,
    Tools,
    declared,
    schema_of,
)
from worker.engine.sequence.calls.families.values import coerced

_ATTRIBUTE = re.compile(r"""(\w+)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""")


def read_invokes(text: str, tools: Tools, prefix: str = "") -> list[ReadCall]:
    """Every invoke in `text` (a wrapper's body), its tags written with `prefix`."""
    opener = f"<{prefix}invoke"
    starts = [m.start() for m in re.finditer(re.escape(opener), text)]
    if not starts or text[: starts[0]].strip():
        raise CallSyntaxError("no invoke")
    ends = [*starts[1:], len(text)]
    return [
        _invoke(text[a + len(opener) : b], tools, prefix) for a, b in zip(starts, ends, strict=True)
    ]


def invoke_frame(
    wrapper: str, wrapper_end: str, prefix: str = "", marked: bool = False
) -> XmlFrame:
    """The frame of forced invoke calls inside `wrapper`, their tags written with `prefix`;
    `marked`: each parameter says how its value is written (DSML's `string="true"` before
    text, `string="false"` before JSON)."""
    return XmlFrame(
        section_start=wrapper + "\n",
        call_start=f'<{prefix}invoke name="',
        name_end='">\n',
        key_start=f'<{prefix}parameter name="',
        key_end='" string="true">' if marked else '">',
        json_key_end='" string="false">' if marked else None,
        value_end=f"</{prefix}parameter>\n",
        call_end=f"</{prefix}invoke>\n",
        section_end=wrapper_end,
    )


def _invoke(block: str, tools: Tools, prefix: str) -> ReadCall:
    attributes, closed, body = block.partition(">")
    name = _attributes(attributes).get("name")
    if not closed or name is None:
        raise CallSyntaxError("an invoke without its name")
    name = declared(tools, name)
    end = body.rfind(f"</{prefix}invoke>")
    if end >= 0:
        if body[end:].partition(">")[2].strip():
            raise CallSyntaxError("text after an invoke")
        body = body[:end]
    properties = schema_of(tools, name).get("properties")
    known = properties if isinstance(properties, dict) else {}
    arguments = {
        key: _value(value, written, known.get(key))
        for key, written, value in _parameters(body, prefix)
    }
    return ReadCall(name, json.dumps(arguments))


def _parameters(body: str, prefix: str) -> list[tuple[str, str | None, str]]:
    """An invoke's parameters as (key, how it says it is written, value text)."""
    opener, closer = f"<{prefix}parameter", f"</{prefix}parameter>"
    opens: list[int] = []
    for match in re.finditer(re.escape(opener) + r"\s", body):
        before = body[: match.start()].rstrip()
        if not opens and before:
            raise CallSyntaxError("text before an invoke's first parameter")
        if not opens or before.endswith(closer):
            opens.append(match.start())
    if not opens:
        if body.strip():
            raise CallSyntaxError("text in an invoke that is no parameter")
        return []
    found = []
    for at, following in zip(opens, [*opens[1:], len(body)], strict=True):
        attributes, closed, value = body[at + len(opener) : following].partition(">")
        named = _attributes(attributes)
        if not closed or "name" not in named:
            raise CallSyntaxError("a parameter without its name")
        last = value.rfind(closer)
        value = value[:last] if last >= 0 else value
        found.append((named["name"], named.get("string"), _unwrapped(value)))
    return found


def _value(text: str, written: str | None, schema: Any) -> Any:
    if written == "true":
        return text
    if written == "false":
        try:
            return json.loads(text)
        except ValueError:
            pass
    return coerced(text, schema)


def _attributes(text: str) -> dict[str, str]:
    """A tag's attributes (`name="x"`, `name='x'` or `name=x`)."""
    return {
        m[1]: next(v for v in m.groups()[1:] if v is not None) for m in _ATTRIBUTE.finditer(text)
    }


def _unwrapped(value: str) -> str:
    """A value less the newline templates write on each side of it."""
    if value.startswith("\n"):
        value = value[1:]
    return value[:-1] if value.endswith("\n") else value
