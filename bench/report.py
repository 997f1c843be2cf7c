"""The benchmarks' outputs: a JSON file, and for `serve` its tables (Markdown) and chart (PNG)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

FORWARD = "forward step (ceiling)"
PEERS = ("mlx_lm.server", "vllm-mlx")
# (heading, row key, digits): the serve table's measured columns.
COLUMNS = (
    ("tok/s", "tokens_per_s", 1),
    ("TTFT p50 ms", "ttft_p50_ms", 0),
    ("TTFT p95 ms", "ttft_p95_ms", 0),
    ("gap p50 ms", "gap_p50_ms", 0),
    ("gap p99 ms", "gap_p99_ms", 0),
    ("peak MB", "peak_mb", 0),
    ("prompt tokens", "prompt_tokens", 0),
    ("errors", "errors", 0),
)
# Columns of the workloads whose rows have them: conversations' turns, the mixed cell's.
TURN_COLUMNS = (
    ("TTFT first turn ms", "ttft_first_ms", 0),
    ("TTFT next turn ms", "ttft_next_ms", 0),
)
MIXED_COLUMNS = (
    ("short TTFT p95 alone ms", "short_ttft_p95_alone_ms", 0),
    ("short TTFT p95 mixed ms", "short_ttft_p95_mixed_ms", 0),
)
EMPTY_COLUMN = ("answers without a token", "empty", 0)
LONG_WINDOW = (
    "on a copy of the model with max_position_embeddings raised to 32,768 in its config.json "
    "(rope as it is: for timing only)"
)
WORKLOAD_TEXT = {
    "short": "about 40 tokens of text each (plus the chat template)",
    "medium": "about 600 tokens of text each",
    "long": "about 2,000 tokens of text each",
    "multiturn": "conversations: a 600-token document, then turns of 40 new tokens, each turn "
    "resending the history",
    "long16k": "a 16,000-token document, then a next turn of 40 new tokens, " + LONG_WINDOW,
    "long30k": "a 30,000-token document, then a next turn of 40 new tokens, " + LONG_WINDOW,
    "mixed": "14 clients of short requests alone, then the same with 2 long16k conversations "
    "at once (TTFT turn columns: the conversations'), " + LONG_WINDOW,
}


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _joined(rows: list[dict[str, Any]], key: str, digits: int) -> str:
    """One cell: the value of each repeat, in repeat order."""
    return " / ".join(_fmt(r.get(key), digits) for r in rows)


def _groups(rows: list[dict[str, Any]], workload: str) -> dict[tuple[int, str], list[Any]]:
    found: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in sorted((r for r in rows if r["workload"] == workload), key=lambda r: r["repeat"]):
        found.setdefault((r["concurrency"], r["system"]), []).append(r)
    return dict(sorted(found.items(), key=lambda kv: kv[0][0]))


def markdown_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines: the headings, the rule under them, then a line a row."""
    return [_row(head), "|" + " --- |" * len(head), *map(_row, rows)]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _columns(rows: list[dict[str, Any]], workload: str) -> tuple[tuple[str, str, int], ...]:
    mine = [r for r in rows if r["workload"] == workload]
    extra = [
        column
        for column in (*TURN_COLUMNS, *MIXED_COLUMNS, EMPTY_COLUMN)
        if any(r.get(column[1]) for r in mine)
    ]
    return (*COLUMNS, *extra)


def _table(rows: list[dict[str, Any]], workload: str) -> list[str]:
    columns = _columns(rows, workload)
    head = ["c", "system", *(h for h, _, _ in columns), "machine busy %"]
    lines = []
    for (c, system), mine in _groups(rows, workload).items():
        cells = [str(c), system, *(_joined(mine, key, d) for _, key, d in columns)]
        busy = [r.get("machine_busy") for r in mine]
        cells.append(" / ".join(_fmt(b * 100 if b is not None else None, 0) for b in busy))
        lines.append(cells)
    return markdown_table(head, lines)


def _ratio_lines(rows: list[dict[str, Any]], workload: str) -> list[str]:
    """mlxq against the better peer and the forward step, per concurrency and repeat."""
    by = {
        (r["concurrency"], r["repeat"], r["system"]): r for r in rows if r["workload"] == workload
    }
    lines = []
    for c, repeat, system in sorted(k for k in by if k[2].startswith("mlxq")):
        mine = by[(c, repeat, system)]
        peers = [by[(c, repeat, p)] for p in PEERS if (c, repeat, p) in by]
        parts = [f"c={c} repeat {repeat}"]
        if peers:
            best = max(peers, key=lambda p: p["tokens_per_s"])
            ratio = mine["tokens_per_s"] / best["tokens_per_s"]
            parts.append(f"{system} / {best['system']} tok/s = {ratio:.2f}")
            if mine["ttft_p50_ms"] is not None and best["ttft_p50_ms"] is not None:
                ours, theirs = mine["ttft_p50_ms"] / 1e3, best["ttft_p50_ms"] / 1e3
                parts.append(f"TTFT p50 {ours:.2f} s vs {theirs:.2f} s")
        parts += _own_ratios(mine)
        forward = by.get((c, repeat, FORWARD))
        if forward:
            parts.append(
                f"mlxq / forward step = {mine['tokens_per_s'] / forward['tokens_per_s']:.2f}"
            )
        lines.append("- " + ", ".join(parts))
    return lines


def _own_ratios(row: dict[str, Any]) -> list[str]:
    """A row's targets against itself: next turn / first turn, short TTFT mixed / alone."""
    pairs = [
        ("next turn / first turn TTFT", "ttft_next_ms", "ttft_first_ms"),
        ("short TTFT p95 mixed / alone", "short_ttft_p95_mixed_ms", "short_ttft_p95_alone_ms"),
    ]
    return [
        f"{label} = {row[top] / row[bottom]:.2f}"
        for label, top, bottom in pairs
        if row.get(top) is not None and row.get(bottom)
    ]


def serve_markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    busy = [r["machine_busy"] for r in rows if r.get("machine_busy") is not None]
    load = [r["load1"] for r in rows if r.get("load1") is not None]
    settings = result["settings"]
    out = [
        f"Run of {result['started']} - {result['finished']}: `{result['command']}`",
        "",
        f"Machine: {result['machine']['summary']}. Whole machine CPU busy during the runs: "
        + (f"median {statistics.median(busy) * 100:.0f}%" if busy else "-")
        + (f"; load average {min(load):.1f}-{max(load):.1f}" if load else "")
        + ". Streamed chat, temperature 0, "
        f"{settings.get('max_tokens')} new tokens a request; values of several repeats "
        "are given in repeat order, separated by /. Peak MB: the sum of the resident-set "
        "high-water marks of the system's processes during that run (mlxq: every process "
        "`mlxq run` started, its pool's workers included; pages they share count in each).",
    ]
    if result.get("not_installed"):
        out += ["", "Not installed (skipped): " + ", ".join(result["not_installed"])]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        out += ["", f"### {workload}: {WORKLOAD_TEXT.get(workload, '')}", ""]
        out += _table(rows, workload)
        out += ["", *_ratio_lines(rows, workload)]
    if result.get("warnings"):
        out += ["", "**Warnings: above the forward step (the ceiling is not one here)**", ""]
        out += [f"- {w}" for w in result["warnings"]]
    return "\n".join(out) + "\n"


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rows))


def serve_chart(result: dict[str, Any], path: Path) -> None:
    rows = result["rows"]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 4), squeeze=False)
    for ax, workload in zip(axes[0], workloads, strict=True):
        groups = _groups(rows, workload)
        for system in dict.fromkeys(s for _, s in groups):
            mine = sorted((c, g) for (c, s), g in groups.items() if s == system)
            ax.plot(
                [c for c, _ in mine],
                [_median(g, "tokens_per_s") for _, g in mine],
                marker="o",
                label=system,
                linestyle="--" if system == FORWARD else "-",
            )
        ax.set(
            xscale="log", xlabel="concurrent streams", ylabel="generated tokens/s", title=workload
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"bench serve, {result['started']} ({result['machine']['summary']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out_dir: Path, name: str, payload: dict[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
