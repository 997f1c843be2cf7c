"""The benchmark's outputs: a JSON file, a PNG chart and a printed table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = "| system | c | tok/s | TTFT p50 ms | TTFT p95 ms | gap p50 ms | gap p99 ms | errors |"
    lines = [head, "|" + " --- |" * 8]
    for r in rows:
        cells = [
            r["system"],
            str(r["concurrency"]),
            _fmt(r["tokens_per_s"]),
            _fmt(r.get("ttft_p50_ms"), 0),
            _fmt(r.get("ttft_p95_ms"), 0),
            _fmt(r.get("gap_p50_ms"), 0),
            _fmt(r.get("gap_p99_ms"), 0),
            str(r.get("errors", "-")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def chart(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    fig, (tput, ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    for system in dict.fromkeys(r["system"] for r in rows):
        mine = sorted((r for r in rows if r["system"] == system), key=lambda r: r["concurrency"])
        xs = [r["concurrency"] for r in mine]
        tput.plot(xs, [r["tokens_per_s"] for r in mine], marker="o", label=system)
        if any(r.get("ttft_p50_ms") is not None for r in mine):
            ttft.plot(xs, [r.get("ttft_p50_ms") for r in mine], marker="o", label=system)
    tput.set(xscale="log", xlabel="concurrent streams", ylabel="generated tokens/s (all streams)")
    ttft.set(xscale="log", xlabel="concurrent streams", ylabel="TTFT p50 (ms)")
    for ax in (tput, ttft):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out_dir: Path, name: str, payload: dict[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
