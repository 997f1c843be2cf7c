"""A batch's own processes, off the API's hub: how one is started, handed its order and reaped.

A batch's intake (api/stores/batch_feed.py) and its finalization (api/stores/batch_finalize.py)
each run in a process of their own: pure-Python parsing, validation and JSON writing hold the
GIL, so in a thread of the API process they would delay every stream's wake-up (docs/benchmarks.md,
"Batch intake"). `launch` starts `python -c "from <module> import main; main()"` with the order
pickled on its stdin and reaps it when it exits (a greenlet under gevent); the process's `main`
reads it back with `read_order`, which also lowers its priority (NICE): on a machine it shares,
the API's streams and the workers come first.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from typing import TypeVar

# The niceness of a batch's processes.
NICE = 10

Order = TypeVar("Order")


def launch(module: str, order: object, answers: bool = False) -> subprocess.Popen[bytes]:
    """Start `module`'s `main` in a process of its own with `order` on its stdin, and reap it
    when it exits; `answers`: its stdout is a pipe the caller reads."""
    process = subprocess.Popen(
        [sys.executable, "-c", f"from {module} import main; main()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE if answers else None,
        close_fds=True,
    )
    assert process.stdin is not None
    with process.stdin:
        process.stdin.write(pickle.dumps(order))
    threading.Thread(target=process.wait, daemon=True).start()
    return process


def read_order(kind: type[Order]) -> Order:
    """In the started process: lower its priority and read its order from stdin."""
    os.nice(NICE)
    order = pickle.load(sys.stdin.buffer)
    if not isinstance(order, kind):
        raise TypeError(f"expected a {kind.__name__} on stdin, got a {type(order).__name__}")
    return order
