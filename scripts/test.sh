#!/usr/bin/env bash
# Set up for testing (scripts/setup.sh test), then lint, type-check and run every test (real
# Redis, real worker, real model).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh test
echo "test: ruff format --check, ruff check, mypy"
.venv/bin/ruff format --check .
.venv/bin/ruff check .
.venv/bin/mypy
echo "test: pytest"
rc=0
.venv/bin/python -m pytest --durations=25 "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test: pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
