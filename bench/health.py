"""`python -m bench health`: how long `/health` waits while one key attacks the API (issue 42's
target: no request makes it wait more than 100 ms).

A private cluster (worker/ops/cluster.py): one redis-server, the API under gunicorn (gevent, one
process, shipped defaults) and one worker on the default model, with two API keys. A thread asks
`GET /health` every 50 ms for the whole run, while the attacks of bench/health_attacks.py run one
after another, each for at most `--seconds`, from the first key. Each attack's window runs from
its start until SETTLE_S after its end (what it left running counts against it); an idle window
comes first. Per window: /health's latency p50, p99 and max, and how many probes took over
100 ms.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.health_attacks import ATTACKS, Attack, Statuses, Target
from bench.health_poller import HealthPoller, Probe
from bench.load import percentile
from bench.machine import describe
from bench.report import markdown_table, write
from worker.gguf.default_model import DEFAULT_MODEL_NAME
from worker.ops.cluster import Cluster

KEYS = ("sk-mlxq-bench-attacker-41c2", "sk-mlxq-bench-bystander-7d90")
HEALTH_EVERY_S = 0.05
PROBE_TIMEOUT_S = 30.0
SETTLE_S = 2.0
TARGET_MS = 100.0


@dataclass(frozen=True)
class Row:
    """One window's figures."""

    attack: str
    what: str
    seconds: float
    requests: str
    probes: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    over_target: int
    failed: int

    @property
    def holds(self) -> bool:
        return self.probes > 0 and self.max_ms <= TARGET_MS and self.failed == 0


def summary(statuses: Statuses) -> str:
    """The attack's requests as `status x count`, most frequent first."""
    return ", ".join(f"{status} x{count}" for status, count in statuses.most_common()) or "-"


def window(
    probes: list[Probe], attack: Attack, start: float, end: float, statuses: Statuses
) -> Row:
    """The row of the probes sent between `start` and `end`."""
    inside = [p for p in probes if start <= p.sent <= end]
    took_ms = [1000 * p.took_s for p in inside]
    nan = float("nan")
    return Row(
        attack=attack.name,
        what=attack.what,
        seconds=end - start,
        requests=summary(statuses),
        probes=len(inside),
        p50_ms=percentile(took_ms, 50) or nan,
        p99_ms=percentile(took_ms, 99) or nan,
        max_ms=max(took_ms, default=nan),
        over_target=sum(ms > TARGET_MS for ms in took_ms),
        failed=sum(p.status != 200 for p in inside),
    )


def table(rows: list[Row]) -> str:
    head = ["attack", "requests (status x count)", "window s", "probes"]
    head += ["p50 ms", "p99 ms", "max ms", "over 100 ms", "failed", "holds"]
    cells = [
        [
            f"{r.attack}: {r.what}",
            r.requests,
            f"{r.seconds:.0f}",
            str(r.probes),
            f"{r.p50_ms:.0f}",
            f"{r.p99_ms:.0f}",
            f"{r.max_ms:.0f}",
            str(r.over_target),
            str(r.failed),
            "yes" if r.holds else "no",
        ]
        for r in rows
    ]
    return "\n".join(markdown_table(head, cells))


def run_attacks(
    target: Target, poller: HealthPoller, attacks: list[Attack], seconds: float
) -> list[Row]:
    rows: list[Row] = []
    for attack in attacks:
        run = attack.prepare(target)  # before the clock: bodies encoded, files uploaded
        start = time.perf_counter()
        try:
            statuses = run(seconds)
        except httpx.HTTPError as err:  # an attack that failed part way is a row too
            statuses = Statuses({f"error: {type(err).__name__}": 1})
        time.sleep(SETTLE_S)
        end = time.perf_counter()
        poller.answered_after(end)  # a probe stalled in this window counts in it
        rows.append(window(poller.probes, attack, start, end, statuses))
        print(table(rows[-1:]), flush=True)
    return rows


def main(args: argparse.Namespace) -> None:
    chosen = [a for a in ATTACKS if not args.only or any(w in a.name for w in args.only)]
    logs = Path(tempfile.mkdtemp(prefix="bench-health-"))
    env = {"MLXQ_API_KEYS": ",".join(KEYS), "MLXQ_PREFIX_CACHE_DIR": str(logs / "prefix")}
    cluster = Cluster("mlxqbenchhealth", 2.0, env=env, logs=logs)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        cluster.start_api_first(1)
        target = Target(cluster.api_url, KEYS[0], DEFAULT_MODEL_NAME)
        poller = HealthPoller(cluster.api_url, HEALTH_EVERY_S, PROBE_TIMEOUT_S)
        poller.start()
        rows = run_attacks(target, poller, chosen, args.seconds)
        poller.stopping.set()
        poller.join(PROBE_TIMEOUT_S)
    finally:
        cluster.stop(quick=True)
    text = table(rows)
    machine = describe()
    payload: dict[str, Any] = {
        "started": started,
        "machine": machine,
        "seconds": args.seconds,
        "logs": str(logs),
        "rows": [{**asdict(r), "holds": r.holds} for r in rows],
        "table": text,
    }
    write(args.out, "health", payload)
    (args.out / "health.md").write_text(f"Machine: {machine['summary']}\n\n{text}\n")
    print(text)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("health", help="/health's latency while one key runs issue 42's attacks")
    p.add_argument("--seconds", type=float, default=30.0, help="the longest each attack runs")
    p.add_argument(
        "--only", nargs="*", default=[], help="attacks whose name contains one of these words"
    )
    p.set_defaults(func=main)
