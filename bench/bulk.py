"""Bulk throughput: a Batch API run of many short chat requests on the real default model.

For each worker batch size (MLXQ_BATCH_SIZE), a fresh mlxq (one worker, one API process) runs
a batch of `--lines` chat requests of `--max-tokens` tokens each through the Batch API, as a
client would: upload the JSONL file, create the batch, poll it, read the output file. It reports
lines/s and generated tokens/s against the bare forward step at that batch size (the ceiling,
bench/engine_only.py in a subprocess), and what an interactive request sees while the batch
runs: time to first token and the gaps between tokens of a few streamed requests sent one after
another, against the same requests on the idle stack just before. A probe that fails is counted
(and shown), not dropped from the figures silently.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from tqdm import tqdm

from bench import systems
from bench.baseline import baseline
from bench.load import chat_body, percentile
from bench.machine import describe
from bench.report import markdown_table, write
from bench.sse_client import StreamRecord, stream_chat
from worker.gguf.default_model import ensure_default_model

PROBES = 4  # interactive requests, one after another, idle and then during the batch
PROBE_TOKENS = 32
PROBE_DELAY_S = 10.0  # into the batch, so that the worker is full of batch lines
PROMPT_TOKENS = 43  # of a line (bench/load.py's chat_body), for the forward step's context


@dataclass
class Probe:
    """What interactive requests saw: TTFT and gaps in ms."""

    ttft_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    failed: int = 0

    def summary(self) -> dict[str, float | None]:
        return {
            "failed": self.failed,
            "ttft_p50_ms": percentile(self.ttft_ms, 50),
            "gap_p50_ms": percentile(self.gaps_ms, 50),
            "gap_p99_ms": percentile(self.gaps_ms, 99),
        }


def probe(running: systems.Running) -> Probe:
    seen = Probe()
    for i in range(PROBES):
        body = chat_body(running.model, 1000 + i, PROBE_TOKENS)
        record: StreamRecord = asyncio.run(stream_chat("127.0.0.1", running.port, body, 300))
        if record.error is None and record.ttft is not None:
            seen.ttft_ms.append(record.ttft * 1e3)
            seen.gaps_ms += [g * 1e3 for g in record.gaps()]
        else:
            seen.failed += 1
    return seen


def batch_file(model: str, lines: int, max_tokens: int) -> bytes:
    rows = []
    for i in range(lines):
        body = chat_body(model, i, max_tokens)
        del body["stream"], body["stream_options"]
        rows.append(
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": body,
            }
        )
    return "\n".join(json.dumps(r) for r in rows).encode()


def run_batch(running: systems.Running, lines: int, max_tokens: int) -> dict[str, Any]:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{running.port}/v1", api_key="bench")
    upload = client.files.create(
        file=("lines.jsonl", batch_file(running.model, lines, max_tokens)), purpose="batch"
    )
    busy = Probe()

    def probe_later() -> None:
        time.sleep(PROBE_DELAY_S)
        nonlocal busy
        busy = probe(running)

    prober = threading.Thread(target=probe_later, daemon=True)
    started = time.perf_counter()
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    prober.start()
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)
    wall = time.perf_counter() - started
    prober.join()
    tokens = ok = 0
    if batch.output_file_id is not None:
        for line in client.files.content(batch.output_file_id).text.splitlines():
            response = json.loads(line)["response"]
            if response is not None and response["status_code"] == 200:
                ok += 1
                tokens += response["body"]["usage"]["completion_tokens"]
    return {
        "status": batch.status,
        "lines_ok": ok,
        "wall_s": wall,
        "lines_per_s": ok / wall,
        "tokens_per_s": tokens / wall,
        "busy": busy.summary(),
    }


def main(args: Any) -> None:
    sizes = [int(n) for n in args.batch_sizes.split(",")]
    model = ensure_default_model(args.models_dir)
    rows = []
    with tqdm(total=len(sizes) + 1, desc="bulk", unit="run") as bar:
        bar.set_postfix_str("forward step")
        context = PROMPT_TOKENS + args.max_tokens // 2
        with baseline(model) as base:  # warmed up, timed over several runs (engine_only.py)
            ceiling = {n: base.forward(n, context)["tokens_per_s"] for n in sizes}
        bar.update()
        for size in sizes:
            bar.set_postfix_str(f"MLXQ_BATCH_SIZE={size}")
            with systems.mlxq(model, batch_size=size) as running:
                idle = probe(running).summary()
                row = {"batch_size": size, **run_batch(running, args.lines, args.max_tokens)}
            forward = ceiling[size]
            row |= {"idle": idle, "forward_tokens_per_s": forward}
            row["x_forward"] = row["tokens_per_s"] / forward
            rows.append(row)
            bar.update()
    settings = {"lines": args.lines, "max_tokens": args.max_tokens, "probes": PROBES}
    machine = describe()
    write(Path(args.out), "bulk", {"machine": machine, "settings": settings, "rows": rows})
    text = _table(rows, args.lines, args.max_tokens)
    (Path(args.out) / "bulk.md").write_text(f"Machine: {machine['summary']}\n\n{text}\n")
    print(text)


# The interactive probes' figures, idle and during the batch, in the table's order.
PROBE_FIGURES = ("ttft_p50_ms", "gap_p50_ms", "gap_p99_ms", "failed")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _table(rows: list[dict[str, Any]], lines: int, max_tokens: int) -> str:
    head = ["MLXQ_BATCH_SIZE", "lines/s", "tokens/s", "forward step tokens/s", "x forward step"]
    head += ["interactive TTFT p50 ms idle / during", "gap p50 ms idle / during"]
    head += ["gap p99 ms idle / during", "failed probes idle / during"]
    cells = []
    for r in rows:
        idle, busy = r["idle"], r["busy"]
        cells.append(
            [
                str(r["batch_size"]),
                f"{r['lines_per_s']:.2f}",
                f"{r['tokens_per_s']:.0f}",
                f"{r['forward_tokens_per_s']:.0f}",
                f"{r['x_forward']:.2f}",
                *(f"{_ms(idle[k])} / {_ms(busy[k])}" for k in PROBE_FIGURES),
            ]
        )
    title = f"Batch API, {lines} chat lines of {max_tokens} tokens, default model, one worker\n"
    return "\n".join([title, *markdown_table(head, cells)])
