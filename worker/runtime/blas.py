"""OpenBLAS for MLX's CPU backend on Linux.

The mlx-cpu wheel links a reference BLAS; preloading the system OpenBLAS makes float32
matmuls ~35x faster (engine-notes). The dynamic loader reads LD_PRELOAD only at process start,
so the worker re-executes itself once with it set. A process that has not loaded MLX yet can
instead load OpenBLAS with its symbols global (`load_in_process`): the tests do, for their
in-process models, without changing what the processes they start inherit.

OpenBLAS picks its kernels from the CPU's family and model number. One too old to know the CPU
falls back to its Prescott kernels (SSE3): Debian 12's 0.3.21 does so on Intel's Emerald
Rapids (model 207), where a 512-token prompt chunk's weight matrices then took 112 ms a layer
against 19 ms with the AVX-512 kernels (`bench.prefill_cost`). There the core is named from
the CPU's flags instead (OPENBLAS_CORETYPE); one the operator set is left alone.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
from pathlib import Path

from shared.queue.config import Settings

log = logging.getLogger(__name__)

CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)


# OpenBLAS's x86 cores without AVX2 kernels: the fallbacks for a CPU it does not know.
WITHOUT_AVX2 = frozenset(
    {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom", "sandybridge", "barcelona"}
)
# The best core each set of CPU flags allows, best first.
BY_FLAGS = (
    ("Cooperlake", {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}),
    ("SkylakeX", {"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
    ("Haswell", {"avx2", "fma"}),
)


def find_openblas() -> str | None:
    return next((c for c in CANDIDATES if Path(c).exists()), None)


def openblas_env() -> dict[str, str]:
    """What this process's environment lacks for MLX's matmuls to run on OpenBLAS: the preload
    (in front of any other) and, where OpenBLAS does not know this CPU, the core to use; {}
    where nothing is missing, or there is no OpenBLAS. A process started with its environment
    and these gets them; OpenBLAS reads them only when it is loaded."""
    library = find_openblas()
    if library is None or not sys.platform.startswith("linux"):
        return {}
    lacking = {}
    preload = os.environ.get("LD_PRELOAD", "")
    if "openblas" not in preload:
        lacking["LD_PRELOAD"] = f"{library} {preload}".strip()
    if "OPENBLAS_CORETYPE" not in os.environ and (core := core_for_unknown_cpu(library)):
        lacking["OPENBLAS_CORETYPE"] = core
    return lacking


@functools.cache
def core_for_unknown_cpu(library: str) -> str | None:
    """The core to name where `library` fell back to kernels without AVX2 on a CPU that has
    it; None where its own choice stands. Loading it here starts its threads in this process,
    which then starts again with the answer (or starts others with it)."""
    try:
        corename = ctypes.CDLL(library).openblas_get_corename
    except (OSError, AttributeError):
        return None
    corename.restype = ctypes.c_char_p
    chosen = (corename() or b"").decode()
    better = better_core(chosen, cpu_flags())
    if better is None:
        return None
    log.warning(
        "OpenBLAS does not know this CPU and chose its %s kernels; naming %s from the CPU's "
        "flags (OPENBLAS_CORETYPE)",
        chosen,
        better,
    )
    return better


def better_core(chosen: str, flags: set[str]) -> str | None:
    """The core to name instead of OpenBLAS's `chosen` on a CPU with these flags, if any."""
    if chosen.lower() not in WITHOUT_AVX2:
        return None
    return next((core for core, needs in BY_FLAGS if needs <= flags), None)


def cpu_flags() -> set[str]:
    """The CPU's feature flags, as Linux lists them ({} elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def load_in_process() -> str | None:
    """Make MLX in this process run its matmuls on OpenBLAS without starting again; the library
    loaded, or None (not Linux, no OpenBLAS, MLX loaded already). Loaded with global symbols
    before MLX is, it answers the BLAS calls ahead of the reference BLAS that MLX links, which
    the dynamic loader binds when MLX loads. The kernels are OpenBLAS's own choice: asking it
    which it chose (core_for_unknown_cpu) loads it, which fixes them."""
    library = find_openblas()
    if library is None or not sys.platform.startswith("linux"):
        return None
    if "mlx.core" in sys.modules:
        log.warning("MLX was loaded before OpenBLAS: it keeps its reference BLAS")
        return None
    ctypes.CDLL(library, mode=os.RTLD_GLOBAL)
    return library


def ensure_openblas_preloaded(settings: Settings) -> None:
    """On Linux, re-exec with OpenBLAS preloaded, or warn once that the worker will be slow."""
    if not sys.platform.startswith("linux") or not settings.openblas:
        return
    import mlx.core as mx  # here, not above: load_in_process must run before MLX is loaded

    if mx.default_device() == mx.gpu:  # CUDA: the matmuls run on the GPU
        return
    if find_openblas() is None:
        log.warning(
            "OpenBLAS not found: MLX's CPU backend will use its reference BLAS and run "
            "several times slower. Install it with: apt-get install libopenblas0-pthread"
        )
        return
    env = dict(os.environ) | openblas_env()
    if settings.blas_threads is not None:
        env["OPENBLAS_NUM_THREADS"] = str(settings.blas_threads)
    if env == os.environ:
        return  # preloaded already (by a parent), with the threads and core asked for
    # OpenBLAS reads OPENBLAS_NUM_THREADS and OPENBLAS_CORETYPE once, when it is loaded: a
    # worker whose parent preloaded it (bench, a supervisor) starts again too when they differ.
    os.execve(sys.executable, [sys.executable, "-m", "worker.ops.cli", *sys.argv[1:]], env)
