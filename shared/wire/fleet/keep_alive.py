"""Ollama's `keep_alive`: how long a model stays loaded once idle, as a request or a setting
says it.

A duration string as Go writes them (`"5m"`, `"1h30m"`, `"90s"`, `"500ms"`), a bare number of
seconds (`300`, `"300"`), `0` (unload as soon as the model is idle) or any negative value (keep
it loaded). Parsed into seconds, with FOREVER (-1) for every negative value, so the pool agent
compares numbers only (worker/pool/agent.py).

A model is shared by every key, so its lifetime is the operator's (`asked`, `stay_s`): `0` and
negative values are operator keys' only (another key gets a 400 naming `keep_alive`), and any
other key's value may lengthen the model's stay, up to MLXQ_KEEP_ALIVE_MAX, never shorten it
below the model's own keep-alive or what an earlier request asked.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator

from shared.wire.errors import InvalidRequestError

FOREVER = -1.0
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ms|us|µs|ns|h|m|s)")
_MAX_TEXT = 64


def keep_alive_seconds(value: Any) -> float:
    """Seconds from a keep_alive value (module docstring); ValueError when it is none of them."""
    if isinstance(value, bool):
        raise ValueError("keep_alive is a duration (such as '5m') or a number of seconds")
    if isinstance(value, int | float):
        return _seconds(float(value))
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        raise ValueError("keep_alive is a duration (such as '5m') or a number of seconds")
    text = value.strip()
    try:
        return _seconds(float(text))
    except ValueError:
        pass
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    parts = _PART.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"keep_alive {value!r} is not a duration such as '5m', '1h30m' or '90s'")
    return _seconds(sign * sum(float(n) * _UNITS[u] for n, u in parts))


def _seconds(value: float) -> float:
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("keep_alive must be a finite number of seconds")
    return FOREVER if value < 0 else value


def asked(seconds: float | None, operator: bool, longest: float) -> float | None:
    """What a request's keep_alive may ask (module docstring): an operator's as it is, another
    key's at most `longest`, refused if it would unload or pin the model."""
    if seconds is None or operator:
        return seconds
    if seconds <= 0:
        raise InvalidRequestError(
            "keep_alive 0 (unload now) and negative values (keep loaded) are for operator keys: "
            "the model is shared by every key",
            param="keep_alive",
        )
    return min(seconds, longest)


def stay_s(requested: float | None, own: float) -> float:
    """How long a model stays once idle: an operator's 0 or FOREVER as it is, else the longer of
    what its requests asked (`requested`, None: nothing) and its own keep-alive `own`."""
    if requested is None:
        return own
    if requested in (0, FOREVER):  # an operator's order
        return requested
    return FOREVER if own == FOREVER else max(requested, own)


# A request's or a setting's keep_alive, as seconds (FOREVER: keep the model loaded).
KeepAlive = Annotated[float, BeforeValidator(keep_alive_seconds)]
