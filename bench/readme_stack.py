"""mlxq as the README starts it (`bash scripts/run.sh` ends in `.venv/bin/mlxq run`), for the
benchmark: the supervised stack with its shipped defaults, the model pool included, kept private.

Private means five settings differ from a user's, each only so that the run neither touches nor
inherits anything of the machine's own mlxq, nor of an earlier run (`PRIVATE`); every other
MLXQ_* variable of the caller's shell is taken out, so the row is the shipped defaults unless
a labelled row sets something. The models folder holds the benchmark's weights (the folder the
peers load, linked, not copied), the embedding model `mlxq run` serves beside it, the CPU
worker's native module, and `window_copy` of the benchmark's model.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.systems import READY_S, Running, answers_completion
from worker.ops.cluster import free_port, spawn, stop, wait_until

# The variables the private stack sets, and why (docs/benchmarks.md repeats this list).
PRIVATE = {
    "REDIS_URL": "a redis-server of its own on a free port: never the machine's 6379",
    "MLXQ_REDIS_DIR": "that Redis's append-only file, in a folder of this run",
    "MLXQ_API_BIND": "the API on a free port: never the 8000 a user's stack may hold",
    "MLXQ_MODELS_DIR": "a models folder holding the benchmark's weights and the 32k-window copy",
    "MLXQ_PREFIX_CACHE_DIR": "an empty disk tier: no prompt is a hit from an earlier run",
}
WINDOW = 32768
WINDOW_SUFFIX = "-32k-window"
STOP_S = 90  # SIGTERM: the pool's workers drain, then Redis stops last


def window_copy(model_dir: Path, into: Path, window: int = WINDOW) -> Path:
    """A copy of `model_dir` whose config.json says `window` positions
    (max_position_embeddings); its other files are links to the originals. The rope is left as
    it is: the copy is for timing long prompts, its answers past the original window are not
    meant to be good."""
    target = into / f"{model_dir.name}{WINDOW_SUFFIX}"
    target.mkdir(parents=True, exist_ok=True)
    for item in model_dir.iterdir():
        if item.name != "config.json" and not (target / item.name).exists():
            (target / item.name).symlink_to(item.resolve())
    config = json.loads((model_dir / "config.json").read_text())
    config["max_position_embeddings"] = window
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return target


def private_models(folder: Path, model_dir: Path, user_models: Path) -> Path:
    """The stack's models folder: the benchmark's model under its own name, and from the user's
    models folder what `mlxq run` would otherwise download or build (the embedding model, the
    native module)."""
    models = folder / "models"
    models.mkdir(parents=True, exist_ok=True)
    (models / model_dir.name).symlink_to(model_dir.resolve())
    for name in (".native", "all-MiniLM-L6-v2"):
        if (user_models / name).exists():
            (models / name).symlink_to((user_models / name).resolve())
    window_copy(model_dir, models)
    return models


def stack_environment(folder: Path, models: Path, settings: dict[str, str]) -> dict[str, str]:
    """The caller's environment without its mlxq settings, plus `PRIVATE`'s and `settings`."""
    kept = {k: v for k, v in os.environ.items() if not (k.startswith("MLXQ_") or k == "REDIS_URL")}
    private = {
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "MLXQ_REDIS_DIR": str(folder / "redis"),
        "MLXQ_API_BIND": f"127.0.0.1:{free_port()}",
        "MLXQ_MODELS_DIR": str(models),
        "MLXQ_PREFIX_CACHE_DIR": str(folder / "prefix-cache"),
    }
    assert set(private) == set(PRIVATE)
    return {**kept, **private, **settings}


def mlxq_executable() -> Path:
    """The `mlxq` entry point of this venv: what scripts/run.sh execs."""
    return Path(sys.executable).parent / "mlxq"


@contextmanager
def readme_stack(
    model_dir: Path, user_models: Path, settings: dict[str, str] | None = None
) -> Iterator[Running]:
    """`mlxq run` on a private Redis, port and models folder, once it has answered
    `model_dir`'s name (its 32k-window copy is `Running.window_model`, which the pool loads on
    its first request); stopped with SIGTERM, as Ctrl-C stops it."""
    folder = Path(tempfile.mkdtemp(prefix="bench-readme-stack-"))
    models = private_models(folder, model_dir, user_models)
    env = stack_environment(folder, models, settings or {})
    port = int(env["MLXQ_API_BIND"].rsplit(":", 1)[1])
    log = Path(tempfile.gettempdir()) / f"bench-mlxq-run-{port}.log"  # kept, as the peers' are
    proc = spawn([str(mlxq_executable()), "run"], env, log)
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"mlxq run exited with {proc.returncode}: see {log}")
            return answers_completion(port, model_dir.name)

        wait_until(ready, READY_S, f"mlxq run's first completion (log: {log})")
        window_model = f"{model_dir.name}{WINDOW_SUFFIX}"  # loaded by its first request
        yield Running(port, model_dir.name, tree=proc.pid, window_model=window_model)
    finally:
        stop(proc, timeout_s=STOP_S)
        shutil.rmtree(folder, ignore_errors=True)
