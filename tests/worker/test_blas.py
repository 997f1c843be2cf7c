"""OpenBLAS under MLX's CPU backend (worker/runtime/blas.py): the kernels it runs must be ones
this CPU can run fastest, also where OpenBLAS is older than the CPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from worker.runtime.blas import WITHOUT_AVX2, better_core, cpu_flags, find_openblas, openblas_env

AVX512 = {"avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"}
CORENAME = """
import ctypes, sys
name = ctypes.CDLL(sys.argv[1]).openblas_get_corename
name.restype = ctypes.c_char_p
print(name().decode())
"""


def test_a_cpu_openblas_does_not_know_gets_the_best_core_its_flags_allow() -> None:
    assert better_core("Prescott", AVX512) == "SkylakeX"
    assert better_core("Prescott", AVX512 | {"avx512_bf16"}) == "Cooperlake"
    assert better_core("Nehalem", {"avx", "avx2", "fma"}) == "Haswell"


def test_a_core_openblas_chose_itself_stands() -> None:
    assert better_core("Haswell", AVX512) is None  # e.g. AMD's Zen 4: OpenBLAS's own choice
    assert better_core("Zen", AVX512) is None
    assert better_core("Prescott", {"sse3", "ssse3"}) is None  # a CPU without AVX2 indeed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OpenBLAS is preloaded on Linux")
def test_the_worker_environment_runs_kernels_the_cpu_can_use() -> None:
    library = find_openblas()
    assert library is not None  # setup installs it
    child = os.environ | openblas_env()
    assert library in child["LD_PRELOAD"]
    chosen = subprocess.run(
        [sys.executable, "-c", CORENAME, library],
        env=child,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if {"avx2", "fma"} <= cpu_flags():
        assert chosen.lower() not in WITHOUT_AVX2, chosen
