"""The baselines' process (bench/engine_only.py), driven line by line from the benchmark.

It stays up for the whole run, warmed up once like every server, and takes its turn in the
same rotation as the servers, so that it is measured under the same conditions as they are.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from worker.ops.cluster import environment, stop
from worker.runtime.blas import openblas_env


class Baseline:
    """mlx-lm alone and the bare forward step, answered by a child process."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        assert proc.stdin is not None and proc.stdout is not None
        self._in: IO[str] = proc.stdin
        self._out: IO[str] = proc.stdout
        self._read()  # {"ready": true}: the model is loaded and warmed up

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> dict[str, Any]:
        line = self._out.readline()
        if not line:
            raise RuntimeError(f"the baseline process exited with {self.proc.wait()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        self._in.write(json.dumps(request) + "\n")
        self._in.flush()
        return self._read()

    def engine(self, prompts: list[list[dict[str, Any]]], batch: int, max_tokens: int) -> Any:
        return self._ask(
            {"op": "engine", "prompts": prompts, "batch": batch, "max_tokens": max_tokens}
        )

    def forward(self, batch: int, context: int) -> dict[str, Any]:
        return self._ask({"op": "forward", "batch": batch, "context": context})


@contextmanager
def baseline(model_dir: Path) -> Iterator[Baseline]:
    args = [sys.executable, "-m", "bench.engine_only", str(model_dir)]
    proc = subprocess.Popen(
        args,
        env=environment(**openblas_env()),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield Baseline(proc)
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        stop(proc)  # type: ignore[arg-type]
