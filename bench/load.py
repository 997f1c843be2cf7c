"""Drive one OpenAI-compatible server at a given concurrency and summarise what clients saw.

`run_load` sends streamed chat requests of a workload (bench/prompts.py): `concurrency`
clients, each sending its requests one after another; for a conversational workload each
request resends the client's conversation so far, with the answer it streamed back.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.prompts import TextMaker, Workload
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
    prompt_tokens: float | None = None  # mean, as the server counted them (usage)
    # Answered without an error but without a token either (a run limit that ended a prefill).
    empty: int = 0
    error_samples: list[str] = field(default_factory=list)  # the first few, to tell why
    # Conversations: TTFT p50 of the first turns, and of the next turns' p50s (a next turn's
    # prefix is the conversation so far: its prefill is what the prefix cache leaves).
    ttft_first_ms: float | None = None
    ttft_next_ms: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarise(
    system: str, concurrency: int, records: list[StreamRecord], wall_s: float
) -> LoadResult:
    ok = [r for r in records if r.error is None]
    tokens = sum(r.tokens() for r in ok)
    ttfts = [t * 1e3 for r in ok if (t := r.ttft) is not None]
    gaps = [g * 1e3 for r in ok for g in r.gaps()]
    prompts = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
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
        prompt_tokens=statistics.mean(prompts) if prompts else None,
        empty=sum(r.tokens() == 0 for r in ok),
        error_samples=list(dict.fromkeys(r.error for r in records if r.error))[:3],
    )


@dataclass(frozen=True)
class Traffic:
    """What the clients of one run send: `requests` each (turns, for a conversation), of
    `workload`, with texts seeded by `seed` (the same seed gives every system the same texts)."""

    workload: Workload
    texts: TextMaker
    seed: str
    requests: int
    max_tokens: int
    timeout_s: float = 900.0


async def _client(port: int, model: str, traffic: Traffic, client: int) -> list[StreamRecord]:
    records: list[StreamRecord] = []
    history: list[dict[str, str]] = []
    for turn in range(traffic.requests):
        seed = f"{traffic.seed}/{client}"
        messages = traffic.workload.messages(traffic.texts, seed, turn, history)
        extra = traffic.workload.extra(seed, turn)
        body = {**chat_body(model, 0, traffic.max_tokens), "messages": messages, **extra}
        record = await stream_chat("127.0.0.1", port, body, traffic.timeout_s)
        records.append(record)
        if traffic.workload.conversational:
            answer = {"role": "assistant", "content": "".join(record.chunk_texts)}
            history = [*messages, answer]
    return records


@dataclass(frozen=True)
class Clients:
    """`count` clients sending `traffic` to `model`: one group of a run that mixes several."""

    model: str
    count: int
    traffic: Traffic


def run_clients(port: int, groups: list[Clients]) -> tuple[list[list[list[StreamRecord]]], float]:
    """Every group's clients at once; each group's records per client, in turn order, and the
    run's wall time."""

    async def main() -> list[list[list[StreamRecord]]]:
        runs = [
            asyncio.gather(*(_client(port, g.model, g.traffic, c) for c in range(g.count)))
            for g in groups
        ]
        return list(await asyncio.gather(*runs))

    started = time.perf_counter()
    records = asyncio.run(main())
    return records, time.perf_counter() - started


def ttft_by_turn_ms(clients: list[list[StreamRecord]]) -> list[float | None]:
    """TTFT p50 of each turn over the clients (a conversation's next turns reuse its prefix)."""
    turns = max((len(c) for c in clients), default=0)
    return [
        percentile(
            [t * 1e3 for c in clients if len(c) > turn and (t := c[turn].ttft) is not None], 50
        )
        for turn in range(turns)
    ]


def run_load(system: str, port: int, model: str, concurrency: int, traffic: Traffic) -> LoadResult:
    """`concurrency` clients at once, each sending its requests one after another."""
    (clients,), wall_s = run_clients(port, [Clients(model, concurrency, traffic)])
    result = summarise(system, concurrency, [r for c in clients for r in c], wall_s)
    if traffic.workload.conversational:
        result.ttft_first_ms, *nexts = ttft_by_turn_ms(clients) or [None]
        result.ttft_next_ms = percentile([t for t in nexts if t is not None], 50)
    return result
