#!/usr/bin/env bash
# Set up for testing (scripts/setup.sh test), then lint, type-check and run every test (real
# Redis, real worker, real model).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh test
echo "test: ruff format --check, ruff check, mypy"
.venv/bin/ruff format --check .
.venv/bin/ruff check .
# mypy keeps its cache beside mlxq's models, so that a fresh clone checks in seconds what an
# earlier clone checked (55 s cold here); the cache is keyed by each file's content.
.venv/bin/mypy --cache-dir "${XDG_CACHE_HOME:-$HOME/.cache}/mlxq/mypy"
echo "test: pytest"
rc=0
# Two processes, a test module at a time each (pytest-xdist): most end-to-end time is spent
# waiting on processes, so one process leaves much of a 2-core machine idle (docs/architecture.md, "Tests").
# The files go out longest first, as tests/ordering.py sorts them, not xdist's most-tests first.
# Arguments after the script's name are pytest's.
.venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=25 "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test: pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
