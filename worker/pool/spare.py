"""The spare worker: a worker process the pool agent starts ahead of any load, so that a load
costs the model's weights and the engine's set-up, not a process start.

A spare does what every worker does before it knows its model (OpenBLAS's preload, which
starts the process again, and the imports of MLX, mlx-lm, transformers and the engine: most
of a worker's start, measured in docs/operations.md), then waits on its stdin for its one
order: the settings of the model to serve (worker/pool/held.py `worker_env`), one JSON object
on one line. It then serves that model as a worker started with those settings would, under
the same process id, so its worker id is the one the agent knows. EOF on its stdin (the agent
stopped or died) ends it.

The agent starts a spare as a new process (fork and exec), never by forking a process that
has imported MLX: MLX's threads do not survive a fork.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from worker.ops.cluster import WORKER, environment, reap, rss_mb, spawn

log = logging.getLogger(__name__)

SPARE = [*WORKER, "--spare"]
# A spare that exits by itself (it should not) is started again after this long.
RESTART_S = 60.0
STOP_S = 5.0


@dataclass
class Spare:
    """A spare worker process, its stdin the pipe its order comes through."""

    proc: subprocess.Popen[bytes]
    started_at: float

    @property
    def worker_id(self) -> str:
        """The id it serves under once told its model (worker/runtime/serve.py)."""
        return f"{socket.gethostname()}.{self.proc.pid}"

    def rss_bytes(self) -> int:
        return int(rss_mb(self.proc.pid) * 2**20) if self.proc.poll() is None else 0

    def hand(self, env: dict[str, str]) -> bool:
        """Give the spare its model's settings; False if it is gone (the load starts afresh)."""
        if self.proc.poll() is not None or self.proc.stdin is None:
            return False
        try:
            self.proc.stdin.write(json.dumps(env).encode() + b"\n")
            self.proc.stdin.close()
        except OSError:  # a broken pipe: it died since
            return False
        return True

    def stop(self) -> None:
        """EOF ends a waiting spare; one still importing is ended by SIGTERM."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):  # a broken pipe: it is gone already
                self.proc.stdin.close()
        if self.proc.poll() is None:
            self.proc.terminate()
        reap(self.proc, STOP_S)


def start_spare() -> Spare:
    proc = spawn(SPARE, environment(), stdin=subprocess.PIPE)
    return Spare(proc, time.time())


@dataclass
class SpareKeeper:
    """A pool's one spare (MLXQ_POOL_SPARE): started when there is none, nothing loads (one
    starting beside a load would take the cores from it) and it fits the budget beside the
    models held; taken by the next load, stopped when it no longer fits."""

    enabled: bool
    start: Callable[[], Spare] = start_spare
    spare: Spare | None = None
    restart_at: float = 0.0  # after a spare exited by itself

    def keep(self, now: float, loading: bool, fits: bool) -> None:
        if not self.enabled:
            return
        if not fits:
            self.stop()
            return
        if self.spare is not None:
            code = self.spare.proc.poll()
            if code is None:
                return
            log.warning("pool: the spare worker exited (%d); another in %.0f s", code, RESTART_S)
            self.spare, self.restart_at = None, now + RESTART_S
        if now >= self.restart_at and not loading:
            self.spare = self.start()

    def take(self) -> Spare | None:
        spare, self.spare = self.spare, None
        return spare

    def stop(self) -> None:
        if self.spare is not None:
            self.spare.stop()
            self.spare = None

    @property
    def worker_id(self) -> str | None:
        return self.spare.worker_id if self.spare is not None else None

    def rss_bytes(self) -> int:
        return self.spare.rss_bytes() if self.spare is not None else 0


def await_order() -> dict[str, str] | None:
    """In the spare: its model's settings, once the agent sends them; None at EOF."""
    line = sys.stdin.buffer.readline()
    if not line.strip():
        return None
    order = json.loads(line)
    return {str(k): str(v) for k, v in order.items()}
