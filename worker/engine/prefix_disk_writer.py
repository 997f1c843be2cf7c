"""The disk tier's writer: one thread that writes the caches handed to it, bounded in bytes
waiting and in bytes written a second, so that a crash loses at most what is still waiting.

The memory tier hands a cache over as soon as it takes it in (write-behind,
worker/engine/prefix_cache.py), and again when it evicts it; the engine thread only queues a
reference (the cache's arrays are real and never changed in place: the memory tier hands out
copies), and the copy the file needs (the arrays cut to their tokens) is made here. A cache that
would take the bytes waiting past `queued_bytes` is dropped, never waited for: the engine's step
does not wait for a disk. Between writes the thread waits as long as `bytes_per_s` asks, so a
burst of long conversations does not take the machine's cores and memory bandwidth from the
engine; while a thread waits for the writes (a flush: shutdown, a model unloaded) or the writer
closes, the writer does not wait between them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shared.queue.prefix.prefix_blocks import HeldPrompt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriteBounds:
    """How far the writer may fall behind (bytes of caches waiting) and how fast it writes."""

    queued_bytes: int
    bytes_per_s: float


# Bounds that never drop nor wait, for a tier whose writes only a test or a tool makes.
UNBOUNDED = WriteBounds(1 << 62, float("inf"))


@dataclass(frozen=True)
class _Write:
    name: str  # the file's name: one wait per name
    held: HeldPrompt
    cache: list[Any]
    nbytes: int


# `write(held, cache)` writes a file and says how many bytes it wrote (0: none, it was there).
WriteFile = Callable[[HeldPrompt, list[Any]], int]


class DiskWriter:
    def __init__(self, write: WriteFile, bounds: WriteBounds):
        self._write = write
        self._bounds = bounds
        self._lock = threading.Lock()  # the bytes and names waiting, between the threads
        self._waiting_bytes = 0
        self._waiting: set[str] = set()
        self._pending: queue.Queue[_Write | None] = queue.Queue()
        self._hurry = threading.Event()  # set: no waits between writes
        self._closed = False
        self._thread = threading.Thread(target=self._write_all, name="prefix-disk", daemon=True)
        self._thread.start()

    def offer(self, name: str, held: HeldPrompt, cache: list[Any], nbytes: int, wait: bool) -> bool:
        """Queue a write of `nbytes` (the cache's arrays) to the file `name`: False when it is
        dropped, as it would take what waits past the bound (unless `wait`: it is never
        dropped). A file already waiting is not queued twice."""
        with self._lock:
            if name in self._waiting:
                return True
            if not wait and self._waiting_bytes + nbytes > self._bounds.queued_bytes:
                return False
            self._waiting.add(name)
            self._waiting_bytes += nbytes
        self._pending.put(_Write(name, held, cache, nbytes))
        return True

    @property
    def waiting_bytes(self) -> int:
        return self._waiting_bytes

    def flush(self) -> None:
        """Wait until every write queued so far is done, written without waits between them."""
        self._hurry.set()
        self._pending.join()
        if not self._closed:
            self._hurry.clear()

    def close(self) -> None:
        """Finish the writes queued so far, without waits between them, then stop."""
        self._closed = True
        self._hurry.set()
        self._pending.put(None)
        self._thread.join()

    def _write_all(self) -> None:
        while (write := self._pending.get()) is not None:
            started = time.perf_counter()
            written = 0
            try:
                written = self._write(write.held, write.cache)
            except Exception:  # a full disk, a folder removed: the next write tries again
                log.exception(
                    "prefix cache: could not write a cache of %d tokens", len(write.held.tokens)
                )
            finally:
                with self._lock:
                    self._waiting.discard(write.name)
                    self._waiting_bytes -= write.nbytes
                self._pending.task_done()
            self._pace(written, time.perf_counter() - started)

    def _pace(self, written: int, took_s: float) -> None:
        """Wait out what writing `written` bytes in `took_s` seconds owes the rate."""
        owed = written / self._bounds.bytes_per_s - took_s
        if owed > 0:
            self._hurry.wait(owed)
