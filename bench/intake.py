"""`python -m bench intake`: what creating a large batch does to the API process it is sent to.

A fresh cluster (worker/ops/cluster.py): one redis-server, one API process (gunicorn, gevent)
and one worker on the SYNTHETIC engine (one token every `--step-ms`, one slot, so the batch's
lines stay queued and only the stream runs). While one chat stream runs through that API
process and a poller asks `/health` every 20 ms, a batch of `--lines` one-token chat lines
(uploaded before) is created. Measured from the create call until the batch holds every line
(today: until its intake process has queued them; before, the create call itself):

- the create call's latency, and how long until every line was taken in;
- `/health`'s latency, max and p99;
- the stream's gaps between tokens, p99 and max (the engine's own step is `--step-ms`).

A last row measures the same figures over a window of BASELINE_S with no batch at all: what the
machine itself (a shared one, say) does to them.

`--root DIR` runs the cluster from another checkout (e.g. a `git worktree` of an older commit),
so the same script measures the code before and after a change; `--label` names the row.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import sse_client
from bench.health_poller import HealthPoller
from bench.load import chat_body, percentile
from bench.machine import describe
from bench.report import markdown_table, write
from bench.sse_client import StreamRecord
from worker.ops.cluster import ROOT, Cluster

MODEL = "synthetic"
HEALTH_EVERY_S = 0.02
SETTLE_S = 2.0  # the stream runs this long before the batch is created, and after it is in
BASELINE_S = 15.0  # the window of the row without a batch


@dataclass(frozen=True)
class Row:
    label: str
    lines: int
    create_s: float
    taken_in_s: float
    health_probes: int
    health_max_ms: float
    health_p99_ms: float
    gaps: int
    gap_p99_ms: float
    gap_max_ms: float


class Stream(threading.Thread):
    """One chat stream, its chunks' arrival times in `record`, until `stop` closes it."""

    def __init__(self, port: int, tokens: int):
        super().__init__(daemon=True)
        self._port, self._body = port, chat_body(MODEL, 0, tokens)
        self.record = StreamRecord(sent_at=time.perf_counter())
        self._loop = asyncio.new_event_loop()
        self._task: asyncio.Task[None] | None = None

    def run(self) -> None:
        # sse_client's own reader, with this record, so the stream can be closed mid-way.
        self._task = self._loop.create_task(
            sse_client._stream("127.0.0.1", self._port, self._body, self.record)
        )
        with contextlib.suppress(asyncio.CancelledError):
            self._loop.run_until_complete(self._task)

    def stop(self) -> None:
        if self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self.join(timeout=30)


def _input(lines: int) -> bytes:
    message = [{"role": "user", "content": "Say hi."}]
    rows = (
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": message, "max_tokens": 1},
        }
        for i in range(lines)
    )
    return "\n".join(json.dumps(row) for row in rows).encode()


def _taken_in(http: httpx.Client, batch: dict[str, Any], lines: int, timeout_s: float) -> None:
    """Wait until the batch holds every line (or has ended)."""
    deadline = time.perf_counter() + timeout_s
    while batch["request_counts"]["total"] < lines and batch["status"] not in ("failed",):
        if time.perf_counter() > deadline:
            raise TimeoutError(f"the batch is still {batch['status']}")
        time.sleep(0.1)
        batch = http.get(f"/v1/batches/{batch['id']}").json()


def measure(
    cluster: Cluster, label: str, lines: int, stream_s: float, step_ms: float, baseline: bool
) -> Row:
    port = int(cluster.api_url.rsplit(":", 1)[1])
    with httpx.Client(base_url=cluster.api_url, timeout=600) as http:
        uploaded = http.post(
            "/v1/files", files={"file": ("in.jsonl", _input(lines))}, data={"purpose": "batch"}
        )
        uploaded.raise_for_status()
        stream = Stream(port, int(stream_s * 1000 / step_ms))
        stream.start()
        health = HealthPoller(cluster.api_url, HEALTH_EVERY_S, timeout_s=60)
        health.start()
        time.sleep(SETTLE_S)
        body = {
            "input_file_id": uploaded.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        start = time.perf_counter()
        if baseline:  # the same window, no batch: what the machine does to the figures itself
            time.sleep(BASELINE_S)
            create_s = 0.0
        else:
            created = http.post("/v1/batches", json=body)
            create_s = time.perf_counter() - start
            created.raise_for_status()
            _taken_in(http, created.json(), lines, timeout_s=900)
        end = time.perf_counter()
        time.sleep(SETTLE_S)
        health.stopping.set()
        stream.stop()
        if not baseline:
            http.post(f"/v1/batches/{created.json()['id']}/cancel")
    health_ms = health.between_ms(start, end)
    times = stream.record.chunk_times
    gaps_ms = [1000 * (b - a) for a, b in itertools.pairwise(times) if start <= b <= end]
    if times and times[-1] < end:
        print(f"{label}: the stream ended before the batch was in; raise --stream-s")
    return Row(
        label=label,
        lines=0 if baseline else lines,
        create_s=create_s,
        taken_in_s=end - start,
        health_probes=len(health_ms),
        health_max_ms=max(health_ms, default=float("nan")),
        health_p99_ms=percentile(health_ms, 99) or float("nan"),
        gaps=len(gaps_ms),
        gap_p99_ms=percentile(gaps_ms, 99) or float("nan"),
        gap_max_ms=max(gaps_ms, default=float("nan")),
    )


def table(rows: list[Row], step_ms: float) -> str:
    head = ["code", "lines", "create s", "all lines in s", "/health max ms", "/health p99 ms"]
    head += [f"stream gap p99 ms (step {step_ms:.0f})", "stream gap max ms"]
    cells = [
        [
            r.label,
            str(r.lines),
            f"{r.create_s:.2f}",
            f"{r.taken_in_s:.1f}",
            f"{r.health_max_ms:.0f}",
            f"{r.health_p99_ms:.0f}",
            f"{r.gap_p99_ms:.0f}",
            f"{r.gap_max_ms:.0f}",
        ]
        for r in rows
    ]
    return "\n".join(markdown_table(head, cells))


def main(args: argparse.Namespace) -> None:
    env = {
        "MLXQ_ENGINE": "synthetic",
        "MLXQ_SYNTHETIC_STEP_S": str(args.step_ms / 1000),
        "MLXQ_BATCH_SIZE": "1",
        "MLXQ_MAX_FILE_BYTES": str(64 * 1024 * 1024),
    }
    rows: list[Row] = []
    for round_ in range(args.rounds):
        runs = [(args.root, args.label, False), (ROOT, "this checkout", False)]
        runs += [(ROOT, "no batch (baseline)", True)]
        for root, label, baseline in runs:
            if root is None:
                continue
            cluster = Cluster(namespace="intake", model=MODEL, env=env, root=Path(root))
            try:
                cluster.start_api_first(1)
                row = measure(cluster, label, args.lines, args.stream_s, args.step_ms, baseline)
                rows.append(row)
            finally:
                cluster.stop()
            print(table(rows[-1:], args.step_ms), f"(round {round_ + 1})", flush=True)
    text = table(rows, args.step_ms)
    payload = {"machine": describe(), "rows": [asdict(r) for r in rows], "table": text}
    write(args.out, "intake", payload)
    print(text)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("intake", help="stalls of the API while a large batch is created")
    p.add_argument("--lines", type=int, default=50_000)
    p.add_argument("--step-ms", type=float, default=20.0, help="synthetic engine step")
    p.add_argument("--stream-s", type=float, default=600.0, help="the longest the stream runs")
    p.add_argument(
        "--rounds", type=int, default=1, help="each: --root, this checkout, then no batch"
    )
    p.add_argument("--root", help="another checkout to measure first (e.g. the code before)")
    p.add_argument("--label", default="before", help="the name of --root's rows")
    p.set_defaults(func=main)
