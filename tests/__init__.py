"""mlxq's tests. Importing the package, before any test module or conftest imports MLX, loads
OpenBLAS into the test process (worker/runtime/blas.py), as the worker runs: the in-process
tests on the real model run their matmuls about 35 times faster than on the reference BLAS that
MLX links. The processes the tests start inherit nothing from it."""

from worker.runtime.blas import load_in_process

OPENBLAS = load_in_process()
