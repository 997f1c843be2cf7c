"""Products of a few rows by a weight matrix, on MLX's CPU backend, that read each weight once.

MLX's CPU backend sends every float32 matmul to `cblas_sgemm`, a decode forward of a few
sequences included, whose inputs are a few rows. OpenBLAS's sgemm packs the weight matrix
before it multiplies, so for a few rows the weights cross memory more than once: the default
model's 211 weight matrices stream at about 10-12 GB/s, where this machine reads about 25 GB/s
(measured: 67aa90f's README, "A few rows, one pass over the weights"). A decode forward reads every
weight of the model, so for a small batch this is most of its time.

So an input of 1 to `ROWS` rows goes through `native/kernels.cpp`'s `matvec`, an MLX
primitive: one row by `cblas_sgemv` (the process's BLAS, the preloaded OpenBLAS, which streams
the weights once), two to six by a kernel of its own that loads each weight vector once for all
the rows (four rows of the weight against up to four input rows in registers), its blocks of
weight rows taken by OpenMP threads as they come free. Larger inputs (batches, prompt chunks)
keep MLX's matmul, which does well there. `attach` changes the class of one model's float32
linear layers (and of a tied embedding read as the output layer) to one that routes by row
count: one comparison per call. MLX's classes are left as they are: other models keep MLX's
matmul. What stays in the process is the loaded native module (an extension cannot be
unloaded), shared by every model attached to it.

The same native module holds the decode attention over 8-bit KV
(worker/engine/cpu/quantized_attention.py routes to it): one build, one check at load.

The primitives are C++, built against the installed MLX headers with nanobind (MLX's binding
library: MLX's arrays cross into the module only when both use the same nanobind ABI and
domain), for the CPU it runs on, the first time a worker needs it, and kept in the models
folder's `.native/`, keyed by the source, MLX, nanobind, Python and the CPU;
`mlxq prepare-model` (and so `scripts/setup.sh`) builds it ahead. Where the build or the check
of its output fails, the worker logs why and keeps MLX's matmul and the pure-MLX quantized
attention.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import logging
import platform
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from worker.engine.cpu.quantized_attention import quantized_attention

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "native" / "kernels.cpp"  # this and the quantized attention
NAME = "_kernels"


# Inputs of at most this many rows take the native product (the module takes up to 8): measured
# on the default model's forward, 1.2-1.4x at 1 to 4 rows, 1.17x at 6, 0.97-1.08x at 8.
ROWS = 6


def _few_rows(x: mx.array) -> bool:
    return x.size <= ROWS * x.shape[-1] and x.dtype == mx.float32


class FewRowsLinear(nn.Linear):
    """A linear layer whose inputs of a few rows take the native product."""

    def __call__(self, x: mx.array) -> mx.array:
        if not _few_rows(x):
            return super().__call__(x)
        y = _native.matvec(x, self["weight"])
        return y + self["bias"] if "bias" in self else y


class FewRowsEmbedding(nn.Embedding):
    """An embedding whose `as_linear` (a tied output layer) routes a few rows the same way."""

    def as_linear(self, x: mx.array) -> mx.array:
        return _native.matvec(x, self.weight) if _few_rows(x) else super().as_linear(x)


_native: Any = None  # the built module, once loaded
_attention_ok: bool | None = None  # whether its decode attention passed its check, once run


def folder(models_dir: Path) -> Path:
    """Where the worker keeps the built module: beside the models it serves."""
    return models_dir / ".native"


def attach(model: nn.Module, folder: Path) -> int:
    """On the CPU device, route the model's float32 products of a few rows through the native
    module (built into `folder` if it is not there yet); the number of layers routed."""
    if native(folder) is None:
        return 0
    routed = 0
    for _, module in model.named_modules():
        if type(module) is nn.Linear and module.weight.dtype == mx.float32:
            module.__class__ = FewRowsLinear
            routed += 1
        elif type(module) is nn.Embedding and module.weight.dtype == mx.float32:
            module.__class__ = FewRowsEmbedding
    log.info("products of 1 to %d rows by the native matvec: %d linear layers", ROWS, routed)
    return routed


def native(folder: Path) -> Any:
    """On the CPU device, the native module (built into `folder` and loaded once per process;
    its `matvec`); None elsewhere or where it cannot be had (logged)."""
    global _native
    if mx.default_device() != mx.cpu:
        return None
    if _native is None:
        _native = load(folder)
    return _native


def attention(folder: Path) -> Any:
    """The native module for its `decode_attention` (worker/engine/cpu/quantized_attention.py),
    once that has been checked against the pure-MLX attention; None where the module or its
    attention cannot be had (logged). A failed check costs the attention only, not the
    products."""
    global _attention_ok
    module = native(folder)
    if module is None:
        return None
    if _attention_ok is None:
        try:
            _check_attention(module)
            _attention_ok = True
        except Exception as err:  # the pure-MLX attention: slower, never wrong
            log.warning(
                "8-bit KV keeps the pure-MLX attention: the native one is unusable: %s", err
            )
            _attention_ok = False
    return module if _attention_ok else None


def load(folder: Path) -> ModuleType | None:
    """The native module, built if needed and checked against MLX's matmul; None (logged) if
    it cannot be had here."""
    try:
        module = _import(build(folder))
        weight = mx.cos(mx.arange(24 * 40, dtype=mx.float32)).reshape(24, 40)
        for rows in (1, 3):  # cblas_sgemv, and the kernel
            x = mx.sin(mx.arange(rows * 40, dtype=mx.float32)).reshape(rows, 1, 40)
            if not mx.allclose(module.matvec(x, weight), x @ weight.T, atol=1e-4).item():
                raise RuntimeError(f"its product of {rows} rows differs from MLX's matmul")
    except Exception as err:  # any failure keeps MLX's matmul: slower, never wrong
        log.warning(
            "products of a few rows keep MLX's matmul, 8-bit KV the pure-MLX attention: the "
            "native module is unusable: %s",
            err,
        )
        return None
    return module


def _check_attention(module: ModuleType) -> None:
    """The module's decode attention against the pure-MLX one, on 2 rows of 3 query heads over
    1 KV head of 50 positions, the second row's last 20 masked."""

    def softmax(scores: mx.array, mask: Any) -> mx.array:
        return mx.softmax(mx.where(mask, scores, -mx.inf), axis=-1)

    queries = mx.sin(mx.arange(2 * 3 * 64, dtype=mx.float32)).reshape(2, 3, 1, 64)
    kv = mx.cos(mx.arange(2 * 50 * 64, dtype=mx.float32) * 0.37).reshape(2, 1, 50, 64)
    keys, values = mx.quantize(kv, 64, 8), mx.quantize(kv[:, :, ::-1], 64, 8)
    mask = (mx.arange(50)[None] < mx.array([[50], [30]])).reshape(2, 1, 1, 50)
    ours = module.decode_attention(queries, *keys, *values, 0.125, 64, mask)
    theirs = quantized_attention(
        queries, keys, values, scale=0.125, mask=mask, group_size=64, bits=8, softmax=softmax
    )
    if not mx.allclose(ours, theirs, atol=1e-4).item():
        raise RuntimeError("its decode attention differs from the pure-MLX attention")


def build(folder: Path) -> Path:
    """The built module's path, compiling it first if this version is not built yet (under a
    lock: workers starting together build it once)."""
    target = folder / _version() / (NAME + str(sysconfig.get_config_var("EXT_SUFFIX")))
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            partial = target.with_suffix(".partial")
            done = subprocess.run(_command(partial), capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"compiling {SOURCE.name} failed: {done.stderr[-2000:]}")
            partial.rename(target)
    return target


def _version() -> str:
    versions = f"{metadata.version('mlx')} {metadata.version('nanobind')} {sys.version}"
    key = [SOURCE.read_bytes(), versions.encode(), _cpu().encode()]
    return hashlib.sha256(b"\0".join(key)).hexdigest()[:16]


def _cpu() -> str:
    """What `-march=native` compiles for: the CPU's model and flags (Linux), else its name."""
    info = Path("/proc/cpuinfo")
    if info.exists():
        lines = info.read_text().splitlines()
        return "".join(sorted({x for x in lines if x.startswith(("model name", "flags"))}))
    return platform.processor()


def _command(output: Path) -> list[str]:
    import nanobind

    mlx_dir = Path(mx.__file__).parent  # site-packages/mlx: include/ and lib/libmlx.so
    nb_dir = Path(nanobind.__file__).parent
    return [
        "c++",
        "-std=c++20",
        "-O3",
        "-march=native",  # built where it runs: the kernel uses the CPU's widest vectors
        "-ffp-contract=fast",  # multiply-adds fused
        "-fopenmp",
        "-shared",
        "-fPIC",
        "-fvisibility=hidden",
        "-DNDEBUG",
        "-DNB_DOMAIN=mlx",  # MLX's nanobind domain: its arrays are this module's arrays
        f"-I{sysconfig.get_paths()['include']}",
        f"-I{mlx_dir / 'include'}",
        f"-I{nb_dir / 'include'}",
        f"-I{nb_dir / 'ext' / 'robin_map' / 'include'}",
        str(SOURCE),
        str(nb_dir / "src" / "nb_combined.cpp"),
        f"-L{mlx_dir / 'lib'}",
        "-lmlx",
        f"-Wl,-rpath,{mlx_dir / 'lib'}",
        "-o",
        str(output),
    ]


def _import(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(NAME, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
