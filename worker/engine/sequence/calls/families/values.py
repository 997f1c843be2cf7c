"""Argument values written as bare text (Qwen3-Coder's `<parameter=k>`, GLM's `<arg_value>`,
MiniMax's and DeepSeek DSML's `<parameter name="k">`), read as the JSON value the tool's schema
asks for.

A value is coerced by the types its property declares (`type`, a list of types, `anyOf`/`oneOf`
members, an `enum`'s values): an integer, number, boolean or null reads as one when the text
says so, an object or array as JSON (or a Python literal, which models write now and then).
When the text does not read as any declared type, it is kept as the string it is: the call is
made with it and the tool (or the client's validation) says what is wrong, rather than the
call being dropped. A property the schema does not declare stays a string, unless its text is
a JSON object or array.
"""

from __future__ import annotations

import ast
import json
from typing import Any

_SCALARS = ("integer", "number", "boolean", "null")


def arguments_json(values: dict[str, str], schema: dict[str, Any]) -> str:
    """A call's written values as its arguments' JSON text, each coerced by `schema`."""
    properties = schema.get("properties")
    known = properties if isinstance(properties, dict) else {}
    return json.dumps({k: coerced(v, known.get(k)) for k, v in values.items()})


def coerced(text: str, schema: Any) -> Any:
    """`text` as the value `schema` (one property's) declares; the text itself where it does
    not read as one."""
    types = _types(schema)
    if not types:
        structured = _structured(text)
        return text if structured is None else structured
    if "string" in types and not (
        "null" in types and text.strip() == "null"
    ):  # a string is what was written, white space and all
        return text
    bare = text.strip()
    for kind in _SCALARS:
        if kind in types:
            found = _scalar(bare, kind)
            if found is not _NOTHING:
                return found
    if "object" in types or "array" in types:
        structured = _structured(bare)
        if structured is not None:
            return structured
    return text


_NOTHING = object()


def _scalar(text: str, kind: str) -> Any:
    if kind == "null":
        return None if text.lower() in ("null", "none") else _NOTHING
    if kind == "boolean":
        return {"true": True, "false": False}.get(text.lower(), _NOTHING)
    try:
        number = float(text)
    except ValueError:
        return _NOTHING
    if number != number or number in (float("inf"), float("-inf")):
        return _NOTHING  # NaN and infinities are no JSON numbers
    if kind == "integer":
        return int(number) if number.is_integer() else _NOTHING
    return int(text) if text.lstrip("+-").isdigit() else number


def _structured(text: str) -> dict[str, Any] | list[Any] | None:
    """`text` as a JSON object or array (or a Python literal of one); None where it is none."""
    bare = text.strip()
    if not bare.startswith(("{", "[")):
        return None
    try:
        found = json.loads(bare)
    except ValueError:
        try:
            found = ast.literal_eval(bare)
            json.dumps(found)  # a tuple or set has no JSON form
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    return found if isinstance(found, dict | list) else None


def _types(schema: Any) -> set[str]:
    """Every JSON type a property's schema allows (empty: it says nothing)."""
    if not isinstance(schema, dict):
        return set()
    found: set[str] = set()
    kind = schema.get("type")
    if isinstance(kind, str):
        found.add(kind)
    elif isinstance(kind, list):
        found.update(k for k in kind if isinstance(k, str))
    for value in schema.get("enum") or ():
        found.add(_json_type(value))
    for key in ("anyOf", "oneOf", "allOf"):
        for member in schema.get(key) or ():
            found |= _types(member)
    return found


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, dict):
        return "object"
    return "array" if isinstance(value, list) else "string"
