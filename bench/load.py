"""Drive one OpenAI-compatible server at a given concurrency and summarise what clients saw."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench.sse_client import StreamRecord, stream_chat

TOPICS = ("the sea", "a lighthouse", "autumn", "a city at night", "a fox", "the moon", "rain")


def chat_body(model: str, i: int, max_tokens: int) -> dict[str, Any]:
    topic = TOPICS[i % len(TOPICS)]
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"Write a long story ({i}) about {topic}."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


@dataclass
class LoadResult:
    system: str
    concurrency: int
    requests: int
    errors: int
    tokens: int
    wall_s: float
    tokens_per_s: float
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    gap_p50_ms: float | None
    gap_p99_ms: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarise(
    system: str, concurrency: int, records: list[StreamRecord], wall_s: float
) -> LoadResult:
    ok = [r for r in records if r.error is None]
    tokens = sum(r.tokens() for r in ok)
    ttfts = [t * 1e3 for r in ok if (t := r.ttft) is not None]
    gaps = [g * 1e3 for r in ok for g in r.gaps()]
    return LoadResult(
        system=system,
        concurrency=concurrency,
        requests=len(records),
        errors=len(records) - len(ok),
        tokens=tokens,
        wall_s=wall_s,
        tokens_per_s=tokens / wall_s if wall_s > 0 else 0.0,
        ttft_p50_ms=percentile(ttfts, 50),
        ttft_p95_ms=percentile(ttfts, 95),
        gap_p50_ms=statistics.median(gaps) if gaps else None,
        gap_p99_ms=percentile(gaps, 99),
    )


async def _client(
    port: int, model: str, ids: list[int], max_tokens: int, out: list[StreamRecord]
) -> None:
    for i in ids:
        out.append(await stream_chat("127.0.0.1", port, chat_body(model, i, max_tokens), 600))


def run_load(
    system: str, port: int, model: str, concurrency: int, per_client: int, max_tokens: int
) -> LoadResult:
    """`concurrency` clients, each sending `per_client` streamed requests one after another."""
    records: list[StreamRecord] = []

    async def main() -> None:
        ids = [[c * per_client + k for k in range(per_client)] for c in range(concurrency)]
        await asyncio.gather(*(_client(port, model, i, max_tokens, records) for i in ids))

    started = time.perf_counter()
    asyncio.run(main())
    return summarise(system, concurrency, records, time.perf_counter() - started)
