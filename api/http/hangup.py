"""Whether the client of the current request has hung up, read from its socket without
blocking.

A request waits for its job's start without writing anything (the answer's status depends on
how the job starts), so a client that left while its job was queued went unnoticed until the job
ran and its first write failed: behind a model's load or a long queue, a worker then generated
for nobody. vLLM checks the same in its queue (starlette's `is_disconnected`); a WSGI app has no
such call, so this polls the socket gunicorn hands over.

The poll is the OS's own (gevent's `select` takes descriptors below 1,024 only, and an API
under load holds more), with a timeout of 0: it never waits. On Linux POLLRDHUP says the peer
closed its end, TLS included; elsewhere a socket readable with nothing to read says it (a TLS
socket cannot be peeked there, so it counts as present). A client that half-closes after its
request counts as gone, as nginx counts it.
"""

from __future__ import annotations

import select
import socket
from typing import Any

from flask import has_request_context, request
from gevent.monkey import get_original

_poll: Any = get_original("select", "poll")
_GONE = getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR


def hung_up() -> bool:
    """True once the client has closed its connection; False while it is open, and where there
    is no socket to read (no request, or the in-process test client)."""
    if not has_request_context():
        return False
    sock: Any = request.environ.get("gunicorn.socket")
    if sock is None or not hasattr(sock, "fileno"):
        return False
    try:
        poller = _poll()
        poller.register(sock.fileno(), select.POLLIN | _GONE)
        ready = poller.poll(0)
        if not ready:
            return False
        if ready[0][1] & _GONE:
            return True
        return bool(sock.recv(1, socket.MSG_PEEK) == b"")
    except ValueError:  # a TLS socket takes no recv flags: present, as far as can be told
        return False
    except OSError:  # reset by the peer, or the socket is closed
        return True
