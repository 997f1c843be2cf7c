"""The side-by-side benchmark: mlxq, mlx_lm.server, vllm-mlx and the baselines, in one run.

mlxq is `mlxq run` as the README starts it, with its shipped defaults (bench/readme_stack.py);
a labelled row (`--mlxq-tuned`, mlxq-kv8, mlxq-nospec) is the same stack with settings on top. The
peers run with their shipped defaults too.

A cell is a workload (bench/prompts.py: short, medium or long prompts, each request with its own
text, multi-turn conversations, 16k- and 30k-token documents on a 32k-window copy of the model,
paragraphs asked back whole or edited)
at a concurrency, or the mixed cell (bench/mixed.py). Every system is started once (a peer a
second time on the 32k-window copy, when a cell needs it), warmed up by a real completion, and
stays up (idle while the others run). For each repeat and cell, the
systems take turns on the same requests, in an order rotated from cell to cell and repeat to
repeat, so that none always runs first or last on a machine whose load drifts. The baselines
(mlx-lm alone, the bare forward step at the cell's batch size and context) run in their own
long-lived process (bench/baseline.py) and take their turn in the same rotation; a server
faster than the forward step of its cell is reported as a warning, since the ceiling is then
not one.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from tqdm import tqdm

from bench import mixed, restart, systems
from bench.baseline import Baseline, baseline
from bench.load import Traffic, run_load
from bench.machine import describe
from bench.mixed import MixedCell
from bench.prompts import WORKLOADS, TextMaker, Workload
from bench.readme_stack import readme_stack, window_copy
from bench.report import serve_chart, serve_markdown, write
from worker.gguf.default_model import ensure_default_model

ENGINE = "engine (mlx-lm BatchGenerator)"
FORWARD = "forward step (ceiling)"
SERVERS = ("mlxq", "mlx_lm.server", "vllm-mlx", "mlxq-kv8", "mlxq-nospec")
# mlxq with its KV quantized to 8 bits (MLXQ_KV_BITS=8): measured in the long-prompt cells only,
# where KV is what fills a worker's memory.
KV8 = "mlxq-kv8"
# mlxq with speculative decoding off (MLXQ_SPECULATION_TOKENS=0; on by default): measured in
# the copy cells, where speculation pays, and the short ones, where it must cost nothing.
SPEC = "mlxq-nospec"
SPEC_CELLS = ("short", "repeat", "edit", "edit-predicted")
LABELLED = {KV8: {"MLXQ_KV_BITS": "8"}, SPEC: {"MLXQ_SPECULATION_TOKENS": "0"}}
PEER_SYSTEMS = ("mlx_lm.server", "vllm-mlx")
TEMPLATE_TOKENS = 30  # the default model's chat template around one user message
# A request of the long cells may wait behind three 30k-token prefills of a peer that runs one
# prompt at a time: on 2 busy cores one of them took over 20 minutes.
LONG_TIMEOUT_S = 4 * 3600.0


@dataclass(frozen=True)
class Cell:
    workload: Workload
    concurrency: int
    requests: int  # per client: one-shot requests, or turns of one conversation
    max_tokens: int

    @property
    def name(self) -> str:
        return self.workload.name

    def context(self) -> int:
        """Tokens in a sequence's KV cache halfway through its answer, on average."""
        w = self.workload
        tokens = TEMPLATE_TOKENS + w.first_tokens + self.max_tokens // 2
        if w.next_tokens is not None:
            tokens += (self.requests - 1) * (w.next_tokens + self.max_tokens) // 2
        return tokens


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def cells(args: Any) -> list[Cell | MixedCell]:
    skip = set(args.skip.split(",")) if args.skip else set()
    found: list[Cell | MixedCell] = []
    for name in args.workloads.split(","):
        if name == restart.WORKLOAD.name:  # a cell of its own: `run`
            continue
        if name == mixed.NAME:
            found.append(MixedCell(args.per_client, args.max_tokens, LONG_TIMEOUT_S))
            continue
        workload = WORKLOADS[name]
        if workload.long_window:
            levels, requests = _ints(args.long_concurrency), workload.turns or args.turns
        elif workload.conversational:
            levels, requests = _ints(args.multiturn_concurrency), args.turns
        else:
            levels, requests = _ints(args.concurrency), args.per_client
        found += [
            Cell(workload, c, requests, args.max_tokens)
            for c in levels
            if f"{name}@{c}" not in skip
        ]
    return found


def _machine_share(measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run `measure`, adding how busy the whole machine was meanwhile (all processes)."""
    busy, total = systems.machine_cpu_seconds()
    started = time.perf_counter()
    row = measure()
    busy2, total2 = systems.machine_cpu_seconds()
    row["machine_busy"] = (busy2 - busy) / (total2 - total) if total2 > total else None
    row["load1"] = os.getloadavg()[0]
    row["measured_s"] = time.perf_counter() - started
    return row


def _server_row(running: systems.Running, load: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`load` run against `running`, with the peak memory of its processes meanwhile (those of
    its tree alive at the end: a pool's worker started by the load counts too)."""

    def measure() -> dict[str, Any]:
        systems.reset_peak_memory(systems.memory_pids(running))
        row = load()
        row["peak_mb"] = systems.peak_memory_mb(systems.memory_pids(running))
        return row

    return _machine_share(measure)


def _engine_row(base: Baseline, cell: Cell, traffic: Traffic) -> dict[str, Any]:
    def measure() -> dict[str, Any]:
        systems.reset_peak_memory([base.pid])
        prompts = [
            cell.workload.messages(traffic.texts, f"{traffic.seed}/{client}", turn, [])
            for client in range(cell.concurrency)
            for turn in range(cell.requests)
        ]
        answer = base.engine(prompts, cell.concurrency, cell.max_tokens)
        return {
            "system": ENGINE,
            "tokens_per_s": answer["tokens_per_s"],
            "peak_mb": systems.peak_memory_mb([base.pid]),
        }

    return _machine_share(measure)


def _forward_row(base: Baseline, cell: Cell) -> dict[str, Any]:
    def measure() -> dict[str, Any]:
        answer = base.forward(cell.concurrency, cell.context())
        return {"system": FORWARD, **answer, "context": cell.context()}

    return _machine_share(measure)


def _peer(name: str, model: Path, vllm_mlx: Path | None) -> AbstractContextManager[systems.Running]:
    if name == "vllm-mlx":
        assert vllm_mlx is not None
        return systems.vllm_mlx(model, vllm_mlx)
    return systems.peer(model)


def _long_window(cell: Cell | MixedCell) -> bool:
    return isinstance(cell, MixedCell) or cell.workload.long_window


class Systems:
    """The systems of this run, started once; names of those not installed are kept apart. A
    peer serves the 32k-window copy from a second process of its own (`window_servers`); the
    mlxq stack serves it beside the model, as a user's would, from its models folder."""

    def __init__(
        self, stack: ExitStack, model: Path, args: Any, grid: list[Cell | MixedCell]
    ) -> None:
        self.servers: dict[str, systems.Running] = {}
        self.window_servers: dict[str, systems.Running] = {}
        self.base: Baseline | None = None
        self.not_installed: list[str] = []
        self.order: list[str] = []
        window = None
        if any(map(_long_window, grid)):
            window = window_copy(model, Path(stack.enter_context(TemporaryDirectory())))
        for name in args.systems.split(","):
            self._start(stack, name, model, window, args)
        for setting in args.mlxq_tuned or []:
            env = dict(pair.split("=", 1) for pair in setting.split(","))
            label = f"mlxq [{setting}]"
            self.servers[label] = stack.enter_context(readme_stack(model, args.models_dir, env))
            self.order.append(label)

    def _start(
        self, stack: ExitStack, name: str, model: Path, window: Path | None, args: Any
    ) -> None:
        if name in ("engine", "forward"):
            self.base = self.base or stack.enter_context(baseline(model))
            self.order.append(ENGINE if name == "engine" else FORWARD)
            return
        if name == "mlxq" or name in LABELLED:
            env = LABELLED.get(name, {})
            self.servers[name] = stack.enter_context(readme_stack(model, args.models_dir, env))
        elif name in PEER_SYSTEMS:
            executable = systems.vllm_mlx_executable(args.vllm_mlx)
            if name == "vllm-mlx" and executable is None:
                self.not_installed.append(name)
                return
            self.servers[name] = stack.enter_context(_peer(name, model, executable))
            if window is not None:
                self.window_servers[name] = stack.enter_context(_peer(name, window, executable))
        else:
            raise SystemExit(
                f"unknown system {name!r}: one of {', '.join(SERVERS)}, engine, forward"
            )
        self.order.append(name)

    def server(self, name: str, cell: Cell | MixedCell) -> systems.Running:
        """Where `name` serves `cell`'s model: the 32k-window copy for the long cells."""
        running = self.servers[name]
        if not _long_window(cell):
            return running
        if running.window_model is not None:
            return replace(running, model=running.window_model)
        return self.window_servers[name]

    def measure(
        self, name: str, cell: Cell | MixedCell, texts: TextMaker, seed: str
    ) -> dict[str, Any] | None:
        if name == KV8 and not (_long_window(cell) or cell.name == "long"):
            return None
        if name == SPEC and not (isinstance(cell, Cell) and cell.name in SPEC_CELLS):
            return None
        if name in self.servers:
            running = self.server(name, cell)
            systems.warm(running)
            if isinstance(cell, MixedCell):
                return _server_row(
                    running, lambda: mixed.measure(running.port, running.model, cell, texts, seed)
                )
            timeout_s = LONG_TIMEOUT_S if _long_window(cell) else Traffic.timeout_s
            traffic = Traffic(cell.workload, texts, seed, cell.requests, cell.max_tokens, timeout_s)
            return _server_row(
                running,
                lambda: run_load(
                    name, running.port, running.model, cell.concurrency, traffic
                ).as_dict(),
            )
        assert self.base is not None
        if isinstance(cell, MixedCell):
            return None  # the baselines have no scheduler to mix requests in
        if name == FORWARD:
            return _forward_row(self.base, cell)
        if cell.workload.conversational:
            return None  # mlx-lm alone keeps no conversation: no engine row for multi-turn
        traffic = Traffic(cell.workload, texts, seed, cell.requests, cell.max_tokens)
        return _engine_row(self.base, cell, traffic)


def ceiling_warnings(rows: list[dict[str, Any]]) -> list[str]:
    """Rows faster than their cell's forward step: that ceiling is not one."""
    warnings = []
    for r in rows:
        if r["system"] == FORWARD:
            continue
        ceiling = next(
            (
                f
                for f in rows
                if f["system"] == FORWARD
                and (f["workload"], f["concurrency"], f["repeat"])
                == (r["workload"], r["concurrency"], r["repeat"])
            ),
            None,
        )
        if ceiling is not None and r["tokens_per_s"] > ceiling["tokens_per_s"]:
            warnings.append(
                f"{r['workload']} c={r['concurrency']} repeat {r['repeat']}: {r['system']} "
                f"{r['tokens_per_s']:.1f} tok/s above the forward step's "
                f"{ceiling['tokens_per_s']:.1f}"
            )
    return warnings


def run(args: Any, save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Measure every cell; `save` gets the results so far after each one (a long run that is
    stopped keeps what it measured)."""
    model = ensure_default_model(args.models_dir)
    texts = TextMaker(model)
    grid = cells(args)
    rows: list[dict[str, Any]] = []
    started = time.time()
    machine = describe()
    restarts: list[dict[str, Any]] = []
    if restart.WORKLOAD.name in args.workloads.split(","):
        restarts = restart.measure(model, texts, args.repeats, args.max_tokens)
    if not grid:
        return _result(args, machine, started, [], [], restarts)
    with ExitStack() as stack:
        running = Systems(stack, model, args, grid)
        names = running.order
        total = args.repeats * len(grid) * len(names)
        with tqdm(total=total, desc="serve", unit="run") as bar:
            for repeat in range(args.repeats):
                for i, cell in enumerate(grid):
                    seed = f"{cell.name}/c{cell.concurrency}/r{repeat}"
                    shift = (repeat + i) % len(names)
                    for position, name in enumerate(names[shift:] + names[:shift]):
                        bar.set_postfix_str(f"{cell.name} c={cell.concurrency} {name}")
                        row = running.measure(name, cell, texts, seed)
                        if row is not None:
                            row |= {
                                "system": name,
                                "workload": cell.name,
                                "concurrency": cell.concurrency,
                                "repeat": repeat,
                                "position": position,
                            }
                            rows.append(row)
                        bar.update()
                    save(_result(args, machine, started, running.not_installed, rows, restarts))
        return _result(args, machine, started, running.not_installed, rows, restarts)


def _result(
    args: Any,
    machine: Any,
    started: float,
    not_installed: list[str],
    rows: list[Any],
    restarts: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "machine": machine,
        "command": "python -m bench " + shlex.join(sys.argv[1:]),
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "settings": {k: str(v) for k, v in vars(args).items() if k != "func"},
        "not_installed": not_installed,
        "rows": rows,
        "restart": restarts,
        "warnings": ceiling_warnings(rows),
    }


def main(args: Any) -> None:
    out = Path(args.out)

    def save(result: dict[str, Any]) -> None:
        write(out, args.name, result)
        if result["rows"]:
            serve_chart(result, out / f"{args.name}.png")
        (out / f"{args.name}.md").write_text(_markdown(result))

    # Stopped with SIGTERM (or Ctrl-C): unwind, so that every system started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = run(args, save)
    save(result)
    print(_markdown(result))


def _markdown(result: dict[str, Any]) -> str:
    return serve_markdown(result) + "\n".join(restart.markdown(result["restart"])) + "\n"
