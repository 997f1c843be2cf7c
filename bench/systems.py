"""The systems under test, each started by the benchmark and stopped after its runs.

- mlxq: `mlxq run` as the README starts it, kept private (bench/readme_stack.py), for `bench
  serve`; `mlxq()` below, a cluster of the benchmark's own (a private redis-server, worker
  process(es) with chosen settings, the API under gunicorn), for the benchmarks that measure a
  part of it.
- the peers: `mlx_lm.server` (from mlx-lm, in this venv) and `vllm-mlx serve --continuous-batching`
  (installed apart, in its own venv, since its dependencies differ: `--vllm-mlx PATH` or
  MLXQ_BENCH_VLLM_MLX names its executable), on the same model directory.
Each gets the system OpenBLAS preloaded where it exists, as the mlxq worker does for itself, and
counts as started only once it has answered a real completion (mlx_lm.server answers
/v1/models before its model is loaded), which is also every system's warm-up.

Peak memory is the resident-set high-water mark (VmHWM) of the processes that hold the model,
reset before each measured run by writing 5 to /proc/PID/clear_refs (Linux; None elsewhere);
for a system started as a process tree (`Running.tree`: `mlxq run`, a peer server), the sum
over every process of the tree, its pool's workers included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from redis import Redis

from worker.ops.cluster import Cluster, environment, free_port, stop, wait_until
from worker.runtime.blas import openblas_env


@dataclass
class Running:
    """A started system: where to send requests and which processes to account CPU to."""

    port: int
    model: str
    api_pids: list[int] = field(default_factory=list)
    redis: Redis | None = None  # mlxq's Redis, for its memory figures
    worker_pids: list[int] = field(default_factory=list)
    redis_pids: list[int] = field(default_factory=list)
    namespace: str = ""
    memory_pids: list[int] = field(default_factory=list)  # the processes holding the model
    cluster: Cluster | None = None  # mlxq's processes, for a cell that restarts its worker
    tree: int | None = None  # the root of its processes, whose memory counts together
    window_model: str | None = None  # the name it serves the 32k-window copy under, if it does


HEARTBEAT_S = 2.0  # the worker's default
READY_S = 600  # loading a model and a first generation, on a busy machine
WARMUP = [{"role": "user", "content": "Say hello in one short sentence."}]


def rerun_with_openblas(module: str) -> None:
    """Start `python -m module` again, same arguments, on OpenBLAS as a worker runs (the
    loader reads LD_PRELOAD only at start), unless it runs so already or there is none."""
    lacking = openblas_env()
    if lacking:
        argv = [sys.executable, "-m", module, *sys.argv[1:]]
        os.execve(sys.executable, argv, {**os.environ, **lacking})


def _serves(port: int, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1) as r:
            return model in {m["id"] for m in json.load(r)["data"]}
    except OSError:
        return False


def answers_completion(port: int, model: str) -> bool:
    """True once the server has generated a real (short) chat completion."""
    body = {"model": model, "messages": WARMUP, "max_tokens": 8, "temperature": 0}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return bool(json.load(r)["choices"][0]["message"]["content"])
    except (OSError, ValueError, KeyError, IndexError):
        return False


def warm(running: Running) -> None:
    """Wait for a real completion of `running.model`: a pool that evicted the model for another
    one loads it again here, not in the cell measured next."""
    wait_until(lambda: answers_completion(running.port, running.model), READY_S, running.model)


def reset_peak_memory(pids: list[int]) -> None:
    for pid in pids:
        clear_refs = Path(f"/proc/{pid}/clear_refs")
        if clear_refs.exists():
            clear_refs.write_text("5")


def peak_memory_mb(pids: list[int]) -> float | None:
    """Sum of the processes' resident-set high-water marks since the last reset (Linux)."""
    total = 0
    for pid in pids:
        status = Path(f"/proc/{pid}/status")
        lines = status.read_text().splitlines() if status.exists() else []
        found = [ln for ln in lines if ln.startswith("VmHWM:")]
        if not found:  # not Linux, or the process has exited (a zombie has no memory lines)
            return None
        total += int(found[0].split()[1])
    return total / 1024


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants, alive now (Linux /proc; [pid] elsewhere)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it exited meanwhile
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += parents.get(current, [])
    return found


def memory_pids(running: Running) -> list[int]:
    """The processes whose peak memory is the system's: its whole tree where it has one."""
    return process_tree(running.tree) if running.tree is not None else running.memory_pids


def cpu_seconds(pids: list[int]) -> float:
    """User+system CPU time of these processes so far (Linux /proc)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores (Linux /proc/stat):
    their ratio over a run says whether the machine itself was the limit."""
    user, nice, system, idle, iowait, *rest = (
        int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]
    )
    busy = user + nice + system + sum(rest[:3])  # irq, softirq, steal
    tick = os.sysconf("SC_CLK_TCK")
    return busy / tick, (busy + idle + iowait) / tick


@contextmanager
def mlxq(
    model_dir: Path,
    batch_size: int | None = None,
    settings: dict[str, str] | None = None,
    workers: int = 1,
    each: list[dict[str, str]] | None = None,
) -> Iterator[Running]:
    """mlxq with its shipped defaults, but for `batch_size` and `settings` where given;
    `each`: one worker per entry, with these settings on top (`workers` is then ignored)."""
    env = {**openblas_env(), **(settings or {})}
    if batch_size is not None:
        env["MLXQ_BATCH_SIZE"] = str(batch_size)
    logs = Path(tempfile.mkdtemp(prefix="bench-mlxq-"))  # api.log and worker.log, if it fails
    cluster = Cluster(
        namespace="bench", heartbeat_s=HEARTBEAT_S, model=str(model_dir), env=env, logs=logs
    )
    name = env.get("MLXQ_MODEL", model_dir.name)
    try:
        cluster.start_redis()
        for own in each if each is not None else [{}] * workers:
            cluster.start_worker(wait=False, **own)
        cluster.start_api()
        port = int(cluster.api_url.rsplit(":", 1)[1])
        wait_until(lambda: _serves(port, name), READY_S, "mlxq to serve the model")
        wait_until(lambda: answers_completion(port, name), READY_S, "mlxq's first completion")
        assert cluster.api_proc is not None
        pids = [cluster.api_proc.pid, *cluster.api_worker_pids()]
        assert cluster.redis_proc is not None
        worker_pids = [w.proc.pid for w in cluster.workers]
        redis_pids = [cluster.redis_proc.pid]
        yield Running(
            port,
            name,
            pids,
            cluster.redis(),
            namespace=cluster.namespace,
            worker_pids=worker_pids,
            redis_pids=redis_pids,
            memory_pids=worker_pids,
            cluster=cluster,
        )
    finally:
        cluster.stop()


@contextmanager
def _server(args: list[str], model: str, what: str, **env_extra: str) -> Iterator[Running]:
    """A peer server process on a free port (`args` without host and port)."""
    port = free_port()
    env = environment(**openblas_env(), **env_extra)
    command = [*args, "--host", "127.0.0.1", "--port", str(port)]
    log = Path(tempfile.gettempdir()) / f"bench-{what}-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}: see {log}")
            return answers_completion(port, model)

        wait_until(ready, READY_S, what)
        yield Running(port, model, [proc.pid], memory_pids=[proc.pid], tree=proc.pid)
    finally:
        stop(proc)


@contextmanager
def peer(model_dir: Path) -> Iterator[Running]:
    """mlx_lm.server with its default settings."""
    args = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model_dir)]
    with _server(args, str(model_dir), "mlx_lm.server") as running:
        yield running


def vllm_mlx_executable(setting: str | None) -> Path | None:
    """The vllm-mlx executable named by `setting` (or MLXQ_BENCH_VLLM_MLX), if it exists."""
    named = setting or os.environ.get("MLXQ_BENCH_VLLM_MLX")
    path = Path(named) if named else None
    return path if path is not None and path.is_file() else None


@contextmanager
def vllm_mlx(model_dir: Path, executable: Path) -> Iterator[Running]:
    """vllm-mlx with continuous batching, otherwise its default settings. It saves its prefix
    cache under ~/.cache at exit and loads it at start: a HOME of its own for each run keeps
    one run's prompts from being cached for the next, as for the other systems."""
    args = [str(executable), "serve", str(model_dir), "--continuous-batching"]
    with (
        tempfile.TemporaryDirectory(prefix="bench-vllm-mlx-") as home,
        _server(args, str(model_dir), "vllm-mlx", HOME=home) as running,
    ):
        yield running
