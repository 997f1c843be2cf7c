"""Whether the client of the current request has hung up, read from its socket without
blocking.

A request waits for its job's start without writing anything (the answer's status depends on
how the job starts), so a client that left while its job was queued went unnoticed until the job
ran and its first write failed: behind a model's load or a long queue, a worker then generated
for nobody. vLLM checks the same in its queue (starlette's `is_disconnected`); a WSGI app has no
such call, so this reads the socket gunicorn hands over: readable with nothing to read is a
peer that closed its end.
"""

from __future__ import annotations

import select
import socket
from typing import Any

from flask import has_request_context, request


def hung_up() -> bool:
    """True once the client has closed its connection; False while it is open, and where there
    is no socket to read (no request, or the in-process test client)."""
    if not has_request_context():
        return False
    sock: Any = request.environ.get("gunicorn.socket")
    if sock is None or not hasattr(sock, "fileno"):
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except ValueError:  # TLS sockets take no recv flags: assume still there
        return False
    except OSError:  # reset by the peer
        return True
