"""`mlxq run`: the whole stack on one machine, kept up by a process supervisor.

Redis: the one at REDIS_URL if it answers, else a redis-server of its own (local URLs only),
supervised like the rest and persistent: an append-only file in MLXQ_REDIS_DIR, fsynced every
second, so a crash, a kill or a reboot loses at most the last second of writes. Then the default
models are prepared, and supervisord (the `supervisor` package) runs that Redis first and the
Procfile's processes: the API under gunicorn, and the machine's model pool (worker/pool/agent.py),
which loads the models of MLXQ_MODELS (or MLXQ_MODEL and the embedding model
MLXQ_EMBEDDING_MODEL) as it starts, a worker process each, and any other model of its catalog
on its first request; the API and the pool wait for Redis, or reconnect to it, by themselves.

A process that exits for any reason is restarted, each restart logged by supervisord once
("exited: ... not expected", then "spawned: ..."); one that keeps exiting before it has been up
`STARTSECS` is retried with a growing back-off (1 s, 2 s, 3 s...) and given up on after
`STARTRETRIES` tries ("gave up: ... FATAL"), while the rest keep serving. Ctrl-C (or SIGTERM)
stops everything, the pool's workers draining their jobs first and Redis last.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from shared.queue.config import Settings
from worker.engine.embedding.download import DEFAULT_EMBEDDER_NAME, ensure_default_embedder
from worker.engine.hub import download, is_hub_id
from worker.gguf.default_model import DEFAULT_MODEL_NAME, ensure_default_model
from worker.ops.cluster import ROOT, redis_answers, redis_command, stop

PROCFILE = ROOT / "Procfile"
# A process counts as started once it has stayed up this long.
STARTSECS = {"redis": 1, "web": 3, "pool": 3}
# supervisord starts lower numbers first and stops them last: Redis outlives draining workers.
PRIORITY = {"redis": 1}
STARTRETRIES = 3
# SIGTERM, then this long for a worker to drain (MLXQ_DRAIN_TIMEOUT_S) before SIGKILL.
STOPWAITSECS = 45


@dataclass(frozen=True)
class Program:
    """One supervised process: a Procfile entry, or the stack's own Redis."""

    name: str
    kind: str  # the Procfile name (web or pool), or redis
    command: str
    env: dict[str, str]


def local_redis(settings: Settings) -> Program:
    """A persistent redis-server on the port of REDIS_URL, if the URL is local."""
    url = settings.redis_url
    parsed = urlparse(url)
    if parsed.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"Redis at {url} does not answer, and it is not local to start it here.")
    command = redis_command(parsed.port or 6379, settings.redis_dir)
    return Program("redis", "redis", shlex.join(command), {})


def run_stack(settings: Settings) -> int:
    own_redis = [] if redis_answers(settings.redis_url) else [local_redis(settings)]
    if DEFAULT_MODEL_NAME in settings.served_models():
        ensure_default_model(settings.models_dir)
    if DEFAULT_EMBEDDER_NAME in settings.served_models():
        ensure_default_embedder(settings.models_dir)
    for model in hub_models(settings):  # the pool's catalog reads their cost from their files
        download(model)
    return supervise(own_redis + programs(PROCFILE.read_text(), settings.served_models()))


def hub_models(settings: Settings) -> list[str]:
    """The served models named by a hub id, not by a folder (here or under the models one)."""
    return [
        m
        for m in settings.served_models()
        if is_hub_id(m) and not (settings.models_dir / m).is_dir()
    ]


def programs(procfile: str, models: list[str]) -> list[Program]:
    """The Procfile's processes (`name: command` lines): the pool loads `models` as it starts
    (a worker process each, worker/pool/agent.py) and any other catalog model on demand."""
    out: list[Program] = []
    for line in procfile.splitlines():
        name, sep, command = line.partition(":")
        if not sep or line.lstrip().startswith("#"):
            continue
        kind = name.strip()
        env = {"MLXQ_POOL_PRELOAD": ",".join(models)} if kind == "pool" else {}
        out.append(Program(kind, kind, command.strip(), env))
    return out


def config(programs: list[Program], folder: Path) -> str:
    """supervisord's configuration: in the foreground, everything's output on this terminal."""
    lines = [
        "[supervisord]",
        "nodaemon=true",
        "logfile=/dev/stdout",
        "logfile_maxbytes=0",
        f"pidfile={folder / 'supervisord.pid'}",
        "loglevel=info",
    ]
    # supervisord expands %(name)s in its values: a literal % is written %%.
    for p in programs:
        lines += [
            "",
            f"[program:{p.name}]",
            f"command={p.command.replace('%', '%%')}",
            f"directory={ROOT}",
            "autorestart=true",
            f"startsecs={STARTSECS.get(p.kind, 3)}",
            f"startretries={STARTRETRIES}",
            f"priority={PRIORITY.get(p.kind, 999)}",
            "stopsignal=TERM",
            f"stopwaitsecs={STOPWAITSECS}",
            "stopasgroup=true",
            "redirect_stderr=true",
            "stdout_logfile=/dev/stdout",
            "stdout_logfile_maxbytes=0",
        ]
        if p.env:
            pairs = (f'{k}="{v.replace("%", "%%")}"' for k, v in p.env.items())
            lines.append("environment=" + ",".join(pairs))
    return "\n".join(lines) + "\n"


def supervise(programs: list[Program]) -> int:
    """Run supervisord over `programs` until it is told to stop."""
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    with tempfile.TemporaryDirectory(prefix="mlxq-run-") as tmp:
        conf = Path(tmp) / "supervisord.conf"
        conf.write_text(config(programs, Path(tmp)))
        # Its own session: Ctrl-C reaches this process only, and supervisord then stops each
        # process with SIGTERM (a worker drains) rather than the terminal interrupting them all.
        supervisord = subprocess.Popen(
            [sys.executable, "-m", "supervisor.supervisord", "-c", str(conf)],
            env=env,
            start_new_session=True,
        )
        signal.signal(signal.SIGTERM, lambda *_: supervisord.terminate())
        try:
            return supervisord.wait()
        except KeyboardInterrupt:
            stop(supervisord, timeout_s=STOPWAITSECS + 15)
            return 0
