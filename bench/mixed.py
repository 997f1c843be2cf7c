"""`bench serve`'s mixed cell: short requests alone, then the same number of short requests while
long conversations run, all at once, on the 32k-window model.

What it answers is whether long prompts starve short ones: the short requests' TTFT p95 with the
long conversations beside them, against theirs alone (target: at most 2x). The short requests
of the two runs have texts of their own (seeds apart), so neither run's are a cache hit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.load import Clients, Traffic, percentile, run_clients, summarise, ttft_by_turn_ms
from bench.prompts import WORKLOADS, TextMaker, Workload

NAME = "mixed"
LONG = Workload("mixed-long", 16_000, 40, turns=2, long_window=True)
SHORT = WORKLOADS["short"]
LONG_CLIENTS = 2
SHORT_CLIENTS = 14


@dataclass(frozen=True)
class MixedCell:
    """One mixed cell: `per_client` short requests per short client, conversations of LONG."""

    per_client: int
    max_tokens: int
    timeout_s: float  # a request's, long conversations' included
    concurrency: int = LONG_CLIENTS + SHORT_CLIENTS

    @property
    def name(self) -> str:
        return NAME


def _short_ttfts_ms(clients: list[list[Any]]) -> list[float]:
    return [t * 1e3 for c in clients for r in c if r.error is None and (t := r.ttft) is not None]


def measure(port: int, model: str, cell: MixedCell, texts: TextMaker, seed: str) -> dict[str, Any]:
    """The short requests alone, then with the long conversations; one row of both."""

    def short(run: str) -> Clients:
        traffic = Traffic(
            SHORT, texts, f"{seed}/short-{run}", cell.per_client, cell.max_tokens, cell.timeout_s
        )
        return Clients(model, SHORT_CLIENTS, traffic)

    (alone,), _ = run_clients(port, [short("alone")])
    long = Traffic(LONG, texts, f"{seed}/long", LONG.turns or 2, cell.max_tokens, cell.timeout_s)
    (shorts, longs), wall_s = run_clients(
        port, [short("mixed"), Clients(model, LONG_CLIENTS, long)]
    )
    everything = [r for c in [*shorts, *longs] for r in c]
    row = summarise(NAME, cell.concurrency, everything, wall_s).as_dict()
    first, *nexts = ttft_by_turn_ms(longs)
    row |= {
        "short_ttft_p95_alone_ms": percentile(_short_ttfts_ms(alone), 95),
        "short_ttft_p95_mixed_ms": percentile(_short_ttfts_ms(shorts), 95),
        "ttft_first_ms": first,  # the long conversations'
        "ttft_next_ms": nexts[0] if nexts else None,
        "errors": row["errors"] + sum(r.error is not None for c in alone for r in c),
    }
    return row
