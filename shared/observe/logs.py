"""How every mlxq process logs: the format (`MLXQ_LOG_FORMAT`: text or JSON lines) and level
(`MLXQ_LOG_LEVEL`), set once at start (`configure`), and the one structured line per request
(API) and per job (worker), `log_event`.

A structured line carries its fields under one attribute of the log record (`FIELDS`): the JSON
format writes them as keys of the line's object (python-json-logger), the text format as
`key=value` after the message. Those lines hold ids, counts and times, the owner as the hashed
id of its API key (api/http/auth.py), never a key, a prompt or an output.

No prompt or output reaches a log, whatever raises, because the formatters write nothing they
were not built to write:
- only `log_event`'s fields: any other extra a library attaches to a record is dropped (RQ
  attaches a failed job's arguments, which are its whole payload, prompt included);
- an exception, as its traceback or as a message's argument (`log.warning("...: %s", err)`),
  as shared/observe/redaction.py writes it: frames and type, no text but an address's or a
  path's.
`configure` also sends exceptions that nothing caught (in any thread) through these formatters,
instead of Python's default printing of the whole exception.
"""

from __future__ import annotations

import logging
import sys
import threading
from types import TracebackType
from typing import Any

from pythonjsonlogger.json import JsonFormatter

from shared.observe.redaction import described, redacted
from shared.queue.config import Settings

TEXT = "%(asctime)s %(name)s %(levelname)s %(message)s"
# The record attribute that holds a structured line's fields (`log_event`).
FIELDS = "mlxq_fields"


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields: dict[str, Any] = getattr(record, FIELDS, None) or {}
    return fields


class TextFormatter(logging.Formatter):
    """The plain format, with a structured line's fields appended as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        _redact(record)
        line = super().format(record)
        pairs = [f"{k}={_text(v)}" for k, v in _fields(record).items()]
        return " ".join([line, *pairs])

    def formatException(self, ei: Any) -> str:
        return redacted(ei[1])


class JsonLinesFormatter(JsonFormatter):
    """One JSON object a line: the format's fields, a structured line's fields as keys, and an
    exception as `redacted` writes it."""

    def format(self, record: logging.LogRecord) -> str:
        _redact(record)
        return super().format(record)

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        for field in self._required_fields:
            log_data[self._get_rename(field)] = record.__dict__.get(field)
        for key, value in message_dict.items():  # exc_info and stack_info, as format() made them
            log_data[self._get_rename(key)] = value
        log_data.update(_fields(record))

    def formatException(self, ei: Any) -> str:
        return redacted(ei[1])


def _redact(record: logging.LogRecord) -> None:
    """An exception among the message's arguments as `described` writes it; an exception's text
    another handler cached dropped, so it is made again by `redacted`."""
    record.exc_text = None
    if isinstance(record.args, tuple):
        args = record.args
        record.args = tuple(described(a) if isinstance(a, BaseException) else a for a in args)


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "-" if value is None else str(value)


def formatter(settings: Settings) -> logging.Formatter:
    """The configured format's formatter."""
    if settings.log_format == "json":
        return JsonLinesFormatter(TEXT, rename_fields={"levelname": "level"})
    return TextFormatter(TEXT)


def configure(settings: Settings) -> None:
    """Send every logger's records to stderr in the configured format and level, and exceptions
    nothing caught through the same formatter."""
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(settings))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    logging.getLogger("mlxq").critical("uncaught exception", exc_info=(kind, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None or isinstance(args.exc_value, SystemExit):
        return
    name = args.thread.name if args.thread is not None else "?"
    exc_info = (args.exc_type, args.exc_value, args.exc_traceback)
    logging.getLogger("mlxq").error("uncaught exception in thread %s", name, exc_info=exc_info)


def log_event(logger: logging.Logger, message: str, **fields: Any) -> None:
    """One structured line (INFO): `message` and its fields."""
    logger.info(message, extra={FIELDS: fields})
