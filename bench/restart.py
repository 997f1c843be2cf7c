"""`bench serve`'s "restart, then the next turn" cell: the prefix cache's disk tier, measured.

One mlxq (one worker; its disk tier, worker/engine/prefix_disk.py, in a folder of this run's own)
serves, each repeat:
1. a cold prefill: the first turn of a conversation whose ~2,000-token message no cache holds;
2. a crash: once the first turn's cache is on disk (written behind, soon after the turn ends:
   the time it took is reported), the worker gets SIGKILL, which lets it write nothing as it
   dies, and a new worker process starts on the same folder, then answers a short warm-up
   request;
3. the conversation's next turn (its first turn, the answer, a short question), restored from
   the file: its TTFT and `cached_tokens`;
4. another cold prefill of the same length on the restarted worker, so that the ratio's two sides
   run on the same processes, before and after the restart;
5. that conversation's next turn, a memory hit, for reference.
Peak MB is the restarted worker's resident-set high-water mark over steps 3-5.
"""

from __future__ import annotations

import asyncio
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import systems
from bench.load import chat_body
from bench.prompts import TextMaker, Workload
from bench.report import markdown_table
from bench.sse_client import StreamRecord, stream_chat
from worker.engine.prefix_file import held_lengths
from worker.ops.cluster import wait_until

WORKLOAD = Workload("restart", 2000, 40)  # a conversation: a 2,000-token document, then turns
DISK_MB = "4096"
# A 2,000-token prompt is prefilled in one engine step; on a shared machine that step can take
# longer than the watchdog's default 60 s, which would then call the worker wedged.
WATCHDOG_S = "900"
WRITTEN_WITHIN_S = 120.0  # the write-behind of the first turn's cache, on a loaded machine


def turns(
    running: systems.Running, texts: TextMaker, seed: str, max_tokens: int
) -> tuple[StreamRecord, list[dict[str, Any]]]:
    """The conversation's first turn, and the messages of its next turn."""
    first = WORKLOAD.messages(texts, seed, 0, [])
    record = stream_turn(running, first, max_tokens)
    answer = {"role": "assistant", "content": "".join(record.chunk_texts)}
    return record, WORKLOAD.messages(texts, seed, 1, [*first, answer])


def stream_turn(
    running: systems.Running, messages: list[dict[str, Any]], max_tokens: int
) -> StreamRecord:
    body = {**chat_body(running.model, 0, max_tokens), "messages": messages}
    record = asyncio.run(stream_chat("127.0.0.1", running.port, body, 900.0))
    if record.error is not None:
        raise RuntimeError(f"a request of the cell failed: {record.error}")
    return record


def _written(folder: Path, before: set[Path], record: StreamRecord, max_tokens: int) -> float:
    """Seconds until a file in the tier's folder, not one of `before`, holds the turn of
    `record`: its prompt, and at most `max_tokens` of answer (an earlier turn's write may still
    land meanwhile, longer)."""
    assert record.prompt_tokens is not None
    least, most = record.prompt_tokens, record.prompt_tokens + max_tokens
    started = time.perf_counter()

    def held() -> bool:
        lengths = held_lengths(folder)
        return any(least <= n <= most for p, n in lengths.items() if p not in before)

    wait_until(held, WRITTEN_WITHIN_S, "the first turn's cache on disk")
    return time.perf_counter() - started


def _restart(running: systems.Running) -> float:
    """Kill the worker (SIGKILL: it writes nothing), start another on the folder; seconds
    taken."""
    assert running.cluster is not None
    started = time.perf_counter()
    running.cluster.kill_worker(running.cluster.workers[0], signal.SIGKILL)
    worker = running.cluster.start_worker(wait=False)  # a model path: no registry wait
    running.worker_pids[:] = running.memory_pids[:] = [worker.pid]

    def answers() -> bool:
        return systems.answers_completion(running.port, running.model)

    wait_until(answers, systems.READY_S, "the restarted worker's first completion")
    return time.perf_counter() - started


def ttft_ms(record: StreamRecord) -> float:
    assert record.ttft is not None
    return record.ttft * 1e3


def _repeat(
    running: systems.Running, folder: Path, texts: TextMaker, repeat: int, max_tokens: int
) -> dict[str, Any]:
    before = set(held_lengths(folder))  # the earlier repeats' files
    cold, restored_turn = turns(running, texts, f"restart/{repeat}/a", max_tokens)
    written_s = _written(folder, before, cold, max_tokens)
    restart_s = _restart(running)
    systems.reset_peak_memory(running.memory_pids)
    restored = stream_turn(running, restored_turn, max_tokens)
    cold_after, memory_turn = turns(running, texts, f"restart/{repeat}/b", max_tokens)
    memory = stream_turn(running, memory_turn, max_tokens)
    cold_ms = statistics.mean([ttft_ms(cold), ttft_ms(cold_after)])
    return {
        "repeat": repeat,
        "prompt_tokens": restored.prompt_tokens,
        "cached_tokens": restored.cached_tokens,
        "cold_ttft_ms": [ttft_ms(cold), ttft_ms(cold_after)],
        "restored_ttft_ms": ttft_ms(restored),
        "ratio": ttft_ms(restored) / cold_ms,
        "memory_ttft_ms": ttft_ms(memory),
        "memory_cached_tokens": memory.cached_tokens,
        "written_s": written_s,
        "restart_s": restart_s,
        "peak_mb": systems.peak_memory_mb(running.memory_pids),
    }


def measure(model: Path, texts: TextMaker, repeats: int, max_tokens: int) -> list[dict[str, Any]]:
    """The cell's rows, one a repeat, on an mlxq of its own (shipped defaults otherwise, but for
    the watchdog)."""
    with tempfile.TemporaryDirectory(prefix="bench-prefix-cache-") as folder:
        settings = {
            "MLXQ_PREFIX_CACHE_DIR": folder,
            "MLXQ_PREFIX_CACHE_DISK_MB": DISK_MB,
            "MLXQ_WATCHDOG_S": WATCHDOG_S,
        }
        with systems.mlxq(model, settings=settings) as running:
            return [_repeat(running, Path(folder), texts, r, max_tokens) for r in range(repeats)]


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The cell's table, and its ratio against the target."""
    if not rows:
        return []
    headings = [
        "repeat",
        "prompt tokens",
        "cached tokens",
        "cold TTFT ms (before / after)",
        "restored TTFT ms",
        "restored / cold",
        "memory-hit TTFT ms",
        "on disk after s",
        "restart s",
        "peak MB",
    ]
    cells = [
        [
            str(r["repeat"]),
            str(r["prompt_tokens"]),
            str(r["cached_tokens"]),
            " / ".join(f"{t:.0f}" for t in r["cold_ttft_ms"]),
            f"{r['restored_ttft_ms']:.0f}",
            f"{r['ratio']:.3f}",
            f"{r['memory_ttft_ms']:.0f}",
            f"{r['written_s']:.1f}",
            f"{r['restart_s']:.1f}",
            f"{r['peak_mb']:.0f}" if r["peak_mb"] is not None else "-",
        ]
        for r in rows
    ]
    ratios = "/".join(f"{r['ratio']:.3f}" for r in rows)
    return [
        "",
        "### restart: a ~2,000-token conversation, the worker killed (SIGKILL), then its next turn",
        "",
        *markdown_table(headings, cells),
        "",
        f"Restored TTFT / cold TTFT: {ratios} (target: at most 0.2, with at least 1,900 cached "
        "tokens). Cold: the first turn of a conversation nothing holds, before the restart and "
        "again after it. On disk after: from the first turn's end to its cache in a file, the "
        "kill only then. Peak MB: the restarted worker's, over its restored turn, a cold "
        "prefill and a memory hit.",
    ]
