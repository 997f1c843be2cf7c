"""Work that would hold the API's hub, run on a native thread instead.

Under gunicorn's gevent worker every request of a process is a greenlet on one hub: a request
that computes for a second (parsing and validating a megabyte body, compiling its JSON schema,
rendering and tokenizing a long prompt, decoding an image) holds every other request of that
process for that second, `/health` included (docs/benchmarks.md, "`/health` while one key
attacks the API"). `off_hub` runs such a step on a small pool of native threads and parks the
calling greenlet until it is done, so the hub goes on serving. On another thread the step still
needs the GIL for its Python parts, but the interpreter hands the GIL over every switch interval
(5 ms), so the hub gets its turns; tokenizers, Pillow and hashlib release it outright.

The pool is small (THREADS): the work is CPU-bound, so more threads would not finish it sooner,
and every thread that wants the GIL is one more the hub waits behind. Without a hub (the
in-process app of the tests, the batch intake's process) the step runs in place.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from gevent import monkey
from gevent.threadpool import ThreadPool

P = ParamSpec("P")
T = TypeVar("T")

THREADS = 2
_pool: tuple[int, ThreadPool] | None = None  # with the pid that made it: not shared after a fork


def off_hub(step: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`step(*args, **kwargs)` on the pool's thread, where there is a hub; its exception, if it
    raises one, is raised here (and not logged by gevent as a thread's failure)."""
    if not monkey.is_module_patched("threading"):
        return step(*args, **kwargs)
    outcome: tuple[T, None] | tuple[None, BaseException] = _pool_of_this_process().apply(
        _outcome, (step, args, kwargs)
    )
    value, error = outcome
    if error is not None:
        raise error
    return value  # type: ignore[return-value]


def _outcome(
    step: Callable[..., T], args: tuple[object, ...], kwargs: dict[str, object]
) -> tuple[T, None] | tuple[None, BaseException]:
    try:
        return step(*args, **kwargs), None
    except Exception as err:
        return None, err


def _pool_of_this_process() -> ThreadPool:
    global _pool
    if _pool is None or _pool[0] != os.getpid():
        _pool = (os.getpid(), ThreadPool(THREADS))
    return _pool[1]
