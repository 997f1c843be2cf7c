"""OpenBLAS for MLX's CPU backend on Linux.

The mlx-cpu wheel links a reference BLAS; preloading the system OpenBLAS makes float32
matmuls ~35x faster (engine-notes). The dynamic loader reads LD_PRELOAD only at process start,
so the worker re-executes itself once with it set.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import mlx.core as mx

from shared.queue.config import Settings

log = logging.getLogger(__name__)

CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)


def find_openblas() -> str | None:
    return next((c for c in CANDIDATES if Path(c).exists()), None)


def ensure_openblas_preloaded(settings: Settings) -> None:
    """On Linux, re-exec with OpenBLAS preloaded, or warn once that the worker will be slow."""
    if not sys.platform.startswith("linux") or not settings.openblas:
        return
    if mx.default_device() == mx.gpu:  # CUDA: the matmuls run on the GPU
        return
    preload = os.environ.get("LD_PRELOAD", "")
    if "openblas" in preload:
        return
    library = find_openblas()
    if library is None:
        log.warning(
            "OpenBLAS not found: MLX's CPU backend will use its reference BLAS and run several "
            "times slower. Install it with: apt-get install libopenblas0-pthread"
        )
        return
    env = dict(os.environ, LD_PRELOAD=f"{library} {preload}".strip())
    if settings.blas_threads is not None:
        env["OPENBLAS_NUM_THREADS"] = str(settings.blas_threads)
    os.execve(sys.executable, [sys.executable, "-m", "worker.ops.cli", *sys.argv[1:]], env)
