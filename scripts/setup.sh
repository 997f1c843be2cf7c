#!/usr/bin/env bash
# Set up what mlxq needs on this machine, idempotently. `setup.sh` (as scripts/run.sh calls it):
# what running needs: redis-server and OpenBLAS (Linux) where missing, the virtualenv .venv with
# mlxq and its worker, and the default model. `setup.sh test` (as scripts/test.sh calls it) adds
# what testing needs: the dev tools in .venv and chromium for the page's browser test.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

purpose=${1:-run}
case "$purpose" in
  run) extra=worker; checks="api, worker, shared, mlx_lm" ;;
  test) extra=dev; checks="api, worker, shared, mlx_lm, pytest, playwright, hypothesis" ;;
  *) echo "usage: scripts/setup.sh [run|test]" >&2; exit 2 ;;
esac

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }

apt_install() {
  command -v apt-get >/dev/null || return 1
  as_root apt-get install -y -q "$@" >/dev/null 2>&1 ||
    { as_root apt-get update -q >/dev/null 2>&1 && as_root apt-get install -y -q "$@" >/dev/null 2>&1; }
}

if ! command -v redis-server >/dev/null; then
  echo "setup: installing redis-server"
  if [ "$(uname)" = Darwin ]; then brew install redis; else apt_install redis-server ||
    echo "setup: could not install redis-server; install it, or point REDIS_URL at a running Redis"; fi
fi

has_openblas() { compgen -G "/usr/lib/*/libopenblas.so.0" >/dev/null || [ -e /usr/lib64/libopenblas.so.0 ]; }
if [ "$(uname)" = Linux ] && ! has_openblas; then
  echo "setup: installing OpenBLAS (MLX's CPU backend is much faster with it)"
  apt_install libopenblas0-pthread || echo "setup: could not install OpenBLAS; the worker will run slower"
fi

# mx.compile on the CPU builds its fused kernels with the host's C++ compiler (mlx-lm's compiled
# functions and the worker's decode exponentials, worker/engine/cpu/exponentials.py).
if [ "$(uname)" = Linux ] && ! command -v c++ >/dev/null; then
  echo "setup: installing a C++ compiler (MLX compiles its fused CPU kernels with it)"
  apt_install g++ || echo "setup: could not install g++; set MLXQ_CPU_DECODE=false"
fi

has_chromium() { command -v chromium >/dev/null || command -v chromium-browser >/dev/null ||
  [ -x /Applications/Chromium.app/Contents/MacOS/Chromium ]; }
if [ "$purpose" = test ] && ! has_chromium; then
  echo "setup: installing chromium (the web page's browser test drives it headless)"
  if [ "$(uname)" = Darwin ]; then brew install --cask chromium; else apt_install chromium ||
    echo "setup: could not install chromium; the browser test (tests/e2e/test_page.py) will fail"; fi
fi

# uv installs into .venv: a fresh clone's install takes about 15 s with its cache warm, against
# 75 s for pip. It compiles the bytecode as pip does, or every process would compile what it
# imports on each start where PYTHONDONTWRITEBYTECODE is set. pip remains if uv cannot be had.
install_uv() {
  .venv/bin/python -m pip install -q --disable-pip-version-check uv ||
    .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
}
install() {
  if [ -x .venv/bin/uv ]; then .venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode "$@"
  else .venv/bin/python -m pip install -q --disable-pip-version-check "$@"; fi
}

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
# One stamp per purpose: what was installed, and from which pyproject.toml.
stamp=.venv/.installed-$purpose
if ! .venv/bin/python -c "import $checks" >/dev/null 2>&1 || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing mlxq[$extra] into .venv"
  log=$(mktemp)
  if ! { install_uv && install -e ".[$extra]"; } >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
  fi
  rm -f "$log"
  touch "$stamp"
fi

# instructor pins jiter below what this project's openai needs, so it cannot live in .venv: its
# test (tests/e2e/test_instructor_partial.py) imports it from a folder of its own.
if [ "$purpose" = test ] && [ ! -d .venv/apart/instructor ]; then
  echo "setup: installing instructor apart (.venv/apart)"
  install --no-deps --target .venv/apart "instructor>=1.17,<2" docstring-parser tenacity >/dev/null
fi

.venv/bin/mlxq prepare-model >/dev/null
