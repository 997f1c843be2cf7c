"""What of an exception a log may hold: its traceback's frames and its type, never its text.

An exception's text may quote anything it was raised over: a chat template's `raise_exception`,
a validation error's input, a token piece, a Redis pipeline's command with its values (redis-py
writes the first 100 characters of the command that failed into the error: an event's text, a
file's lines). The frames are the code's own lines, and the type says what went wrong. Only the
types in `SAFE_TEXT` keep their text, since it names an address, a path or Redis's own
complaint; a Redis pipeline error keeps its command's name but not its values.
shared/observe/logs.py's formatters write every exception through `redacted` (a traceback) or
`described` (an exception given as a message's argument).
"""

from __future__ import annotations

import re
import traceback

from redis.exceptions import RedisError

SAFE_TEXT: tuple[type[BaseException], ...] = (OSError, RedisError)
# redis-py's annotation of a pipeline's error: "Command # 3 (HSET key field value...) of
# pipeline caused error: OOM ...".
_PIPELINE = re.compile(r"^Command # (\d+) \((\S+).*\) of pipeline caused error: ", re.DOTALL)
_PIPELINE_KEPT = r"Command # \1 (\2 ...) of pipeline caused error: "
_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def described(exc: BaseException) -> str:
    """One line: the exception's type, and its text if that is safe to log."""
    kind = type(exc)
    name = kind.__qualname__
    if kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    text = str(exc)
    if not text:
        return name
    if not isinstance(exc, SAFE_TEXT):
        return f"{name} (its text is not logged)"
    return f"{name}: {_PIPELINE.sub(_PIPELINE_KEPT, text)}"


def redacted(exc: BaseException) -> str:
    """The exception as Python prints its traceback, chained exceptions included, each
    `described`."""
    blocks: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames = traceback.extract_tb(current.__traceback__)
        head = ["Traceback (most recent call last):\n", *frames.format()] if frames else []
        blocks.insert(0, "".join([*head, described(current), "\n"]))
        if current.__cause__ is not None:
            blocks.insert(0, _CAUSE)
            current = current.__cause__
        elif current.__context__ is not None and not current.__suppress_context__:
            blocks.insert(0, _CONTEXT)
            current = current.__context__
        else:
            current = None
    return "".join(blocks).strip("\n")
