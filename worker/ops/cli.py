"""The `mlxq` command: run the stack, run a worker, import models, submit and follow batches,
see the fleet."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from pydantic import ValidationError
from redis.exceptions import RedisError

from shared.observe.logs import configure
from shared.queue.config import Settings
from shared.wire.errors import ModelImportError
from worker.gguf import DTYPES

# What a command's bad input or unreachable Redis raises: told in one line, exit status 1. Any
# other exception is a bug, and keeps its traceback.
USER_ERRORS = (ModelImportError, OSError, RedisError, ValidationError)


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    from worker.runtime.blas import ensure_openblas_preloaded

    # Before the engine's imports (seconds): the process may start again to preload OpenBLAS.
    ensure_openblas_preloaded(settings)
    from worker.runtime.serve import serve

    if args.spare:  # worker/pool/spare.py: imported already, it waits for its model
        from worker.pool.spare import await_order

        order = await_order()
        if order is None:
            return 0
        os.environ.update(order)
        settings = Settings()
    serve(settings)
    # Stopped cleanly: its jobs are handed on and its cache is on disk. The interpreter's own
    # finalization, beside MLX's and OpenBLAS's threads, could outlast the pool's 45 s wait for
    # the process (seen under load), so it ends here, as the wedged path does (serve.py).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _pool(args: argparse.Namespace, settings: Settings) -> int:
    from worker.pool.agent import serve_pool

    serve_pool(settings)
    return 0


def _order(args: argparse.Namespace, settings: Settings) -> int:
    """`mlxq load|unload|pin|unpin MODEL`: an order to every pool (worker/pool/agent.py)."""
    import time

    from shared.queue import pool
    from shared.queue.connection import connect
    from shared.queue.keys import Keys
    from shared.wire.fleet.pool import PoolOrder

    redis, keys = connect(settings), Keys(settings.namespace)
    if args.command in ("pin", "unpin"):
        pool.pin(redis, keys, args.model, pinned=args.command == "pin")
    else:
        order = PoolOrder(action=args.command, at=time.time())
        pool.give_order(redis, keys, args.model, order)
    print(f"{args.command}: {args.model}")
    return 0


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from worker.ops.stack import run_stack

    return run_stack(settings)


def _import_gguf(args: argparse.Namespace, settings: Settings) -> int:
    from worker.gguf.convert import import_gguf

    source = Path(args.file)
    out = Path(args.out) if args.out else settings.models_dir / (args.name or source.stem)
    print(import_gguf(source, out, dtype=args.dtype))
    return 0


def _prepare(args: argparse.Namespace, settings: Settings) -> int:
    from worker.engine.embedding.download import ensure_default_embedder
    from worker.gguf.default_model import ensure_default_model

    print(ensure_default_model(settings.models_dir))
    print(ensure_default_embedder(settings.models_dir))
    if sys.platform.startswith("linux"):  # the CPU worker's native module, built ahead
        from worker.engine.model import build_native

        try:
            print(build_native(settings.models_dir))
        except (OSError, RuntimeError) as err:  # the worker then keeps the pure-MLX paths
            print(f"mlxq: the native module was not built: {err}", file=sys.stderr)
    return 0


def _status(args: argparse.Namespace, settings: Settings) -> int:
    from worker.ops.status import run_status

    return run_status(settings, args.json, args.watch, args.interval)


def _batch(args: argparse.Namespace, settings: Settings) -> int:
    from worker.ops import batch_client as bc

    client = bc.BatchClient.from_env(settings.api_bind)
    try:
        if args.batch_command == "submit":
            return bc.submit(client, Path(args.file), args.endpoint, args.wait)
        if args.batch_command == "results":
            errors = Path(args.errors) if args.errors else None
            return bc.results(client, args.batch_id, Path(args.out), errors)
        batch = client.cancel(args.batch_id) if args.batch_command == "cancel" else None
        print(bc.summary(batch or client.get(args.batch_id)))
        return 0
    except bc.ApiError as err:
        print(f"mlxq batch: {err}", file=sys.stderr)
        return 2


def _batch_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    batch = sub.add_parser(
        "batch", help="submit and follow batches (OPENAI_BASE_URL, OPENAI_API_KEY)"
    )
    cmd = batch.add_subparsers(dest="batch_command", required=True)
    submit = cmd.add_parser("submit", help="upload a JSONL file of requests and start a batch")
    submit.add_argument("file", help="the .jsonl file ({custom_id, method, url, body} a line)")
    submit.add_argument("--endpoint", help="default: the url of the file's first line")
    submit.add_argument("--wait", action="store_true", help="show progress until it ends")
    cmd.add_parser("status", help="a batch's status and counts").add_argument("batch_id")
    cmd.add_parser("cancel", help="cancel a batch").add_argument("batch_id")
    results = cmd.add_parser("results", help="download a finished batch's output file")
    results.add_argument("batch_id")
    results.add_argument("-o", "--out", required=True, help="where the output lines go")
    results.add_argument("--errors", help="where the error lines go (if any)")


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, with its error in one line (the usage is one `--help` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="mlxq", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "run", help="Redis (if none), the API and a worker for each default model (chat, embedding)"
    )
    worker = sub.add_parser("worker", help="serve MLXQ_MODEL from the queue at REDIS_URL")
    worker.add_argument("--spare", action="store_true", help=argparse.SUPPRESS)
    sub.add_parser("pool", help="this machine's model pool: load and unload models on demand")
    for order, says in [
        ("load", "load a catalog model on a pool with room"),
        ("unload", "unload a model everywhere (its workers drain and exit)"),
        ("pin", "keep a model loaded: never unloaded for idleness nor evicted"),
        ("unpin", "let a pinned model unload again"),
    ]:
        sub.add_parser(order, help=says).add_argument("model")
    sub.add_parser(
        "prepare-model", help="download and import the default models (chat and embedding)"
    )
    imp = sub.add_parser(
        "import-gguf", help="import a GGUF file (llama, mistral, qwen2, qwen3, gemma3, phi3)"
    )
    imp.add_argument("file", help="the .gguf file")
    imp.add_argument("--name", help="model name under MLXQ_MODELS_DIR (default: file stem)")
    imp.add_argument("--out", help="output directory (overrides --name)")
    imp.add_argument(
        "--dtype",
        choices=DTYPES,
        default="keep",
        help="keep the file's precision (quantized tensors as MLX 4- or 8-bit), dequantize to a "
        "float type, or quantize every linear weight to MLX's 4 or 8 bits (q4, q8)",
    )
    _batch_parser(sub)
    status = sub.add_parser("status", help="live workers, queues and recent jobs (from REDIS_URL)")
    status.add_argument("--watch", action="store_true", help="refresh in place")
    status.add_argument("--json", action="store_true", help="the snapshot as JSON, for scripts")
    status.add_argument("--interval", type=_seconds, default=2.0, help="seconds between refreshes")
    return p


COMMANDS = {
    "run": _run,
    "worker": _worker,
    "pool": _pool,
    "load": _order,
    "unload": _order,
    "pin": _order,
    "unpin": _order,
    "prepare-model": _prepare,
    "import-gguf": _import_gguf,
    "batch": _batch,
    "status": _status,
}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        settings = Settings()
        configure(settings)
        return COMMANDS[args.command](args, settings)
    except USER_ERRORS as err:
        print(f"mlxq {args.command}: {_one_line(err)}", file=sys.stderr)
        return 1


def _one_line(err: Exception) -> str:
    if isinstance(err, ValidationError):  # a bad MLXQ_* variable: name the first one
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"invalid setting {where}: {first['msg']}"
    text = " ".join(str(err).split()) or type(err).__name__
    return f"Redis: {text}" if isinstance(err, RedisError) else text


if __name__ == "__main__":
    sys.exit(main())
