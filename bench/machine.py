"""A description of the machine a benchmark ran on, stored with its results."""

from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return None


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "absent"


def describe() -> dict[str, Any]:
    memory = _memory_gib()
    cores = os.cpu_count()
    summary = f"{cores} cores {_cpu_model()}, {memory:.0f} GiB" if memory else f"{cores} cores"
    return {
        "summary": summary,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": {p: _version(p) for p in ("mlx", "mlx-lm", "redis", "rq", "gunicorn")},
    }
