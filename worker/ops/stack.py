"""`mlxq run`: the whole stack on one machine, for a newcomer's first command.

Redis: the one at REDIS_URL if it answers, else a private redis-server started here (local
URLs only). Then the default model is prepared, and honcho runs the Procfile's processes
(the API under gunicorn and one worker) until Ctrl-C, which stops everything it started.
"""

from __future__ import annotations

import os
import subprocess
import sys
from urllib.parse import urlparse

from honcho.environ import parse_procfile
from honcho.manager import Manager

from shared.config import Settings
from worker.gguf.default_model import DEFAULT_MODEL_NAME, ensure_default_model
from worker.ops.cluster import ROOT, redis_answers, start_redis, stop

PROCFILE = ROOT / "Procfile"


def start_local_redis(url: str) -> subprocess.Popen[bytes]:
    """A throwaway redis-server on the URL's port, if the URL is local."""
    parsed = urlparse(url)
    if parsed.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"Redis at {url} does not answer, and it is not local to start it here.")
    return start_redis(parsed.port or 6379)


def run_stack(settings: Settings) -> int:
    redis_server = (
        None if redis_answers(settings.redis_url) else start_local_redis(settings.redis_url)
    )
    try:
        if settings.model == DEFAULT_MODEL_NAME:
            ensure_default_model(settings.models_dir)
        return _run_procfile()
    finally:
        if redis_server is not None:
            stop(redis_server)


def _run_procfile() -> int:
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    manager = Manager()
    for name, command in parse_procfile(PROCFILE.read_text()).processes.items():
        manager.add_process(name, command, env=env, cwd=str(PROCFILE.parent))
    manager.loop()
    return int(manager.returncode or 0)
