#!/usr/bin/env bash
# The whole stack on 127.0.0.1:8000: Redis (if none at REDIS_URL), the API and one worker. Sets up
# only what running needs (scripts/setup.sh): no test tools, no browser.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec .venv/bin/mlxq run
