"""How every mlxq process logs: the format (`MLXQ_LOG_FORMAT`: text or JSON lines) and level
(`MLXQ_LOG_LEVEL`), set once at start (`configure`), and the one structured line per request
(API) and per job (worker), `log_event`.

A structured line carries its fields as the log record's extras: the JSON format writes them as
keys of the line's object (python-json-logger), the text format as `key=value` after the message.
Those lines hold ids, counts and times, the owner as the hashed id of its API key
(api/http/auth.py), never a key, a prompt or an output.
"""

from __future__ import annotations

import logging
from typing import Any

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

from shared.queue.config import Settings

TEXT = "%(asctime)s %(name)s %(levelname)s %(message)s"
_STANDARD = frozenset(RESERVED_ATTRS) | {"message", "asctime", "taskName"}


class TextFormatter(logging.Formatter):
    """The plain format, with a structured line's fields appended as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = {k: v for k, v in record.__dict__.items() if k not in _STANDARD}
        return " ".join([line, *(f"{k}={_text(v)}" for k, v in fields.items())])


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "-" if value is None else str(value)


def configure(settings: Settings) -> None:
    """Send every logger's records to stderr in the configured format and level."""
    handler = logging.StreamHandler()
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter(TEXT, rename_fields={"levelname": "level"}))
    else:
        handler.setFormatter(TextFormatter(TEXT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level)


def log_event(logger: logging.Logger, message: str, **fields: Any) -> None:
    """One structured line (INFO): `message` and its fields."""
    logger.info(message, extra=fields)
