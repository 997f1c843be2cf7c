"""The side-by-side benchmark: engine alone, mlx_lm.server (the peer) and mlxq, one run.

For each concurrency level, every system gets the same streamed chat requests from the same
client code (bench/load.py), one system at a time on this machine, the peer and mlxq back to
back at each level, so their ratios are comparable even on a noisy machine. The engine alone
and the bare forward step run in a subprocess with the same weights; the naive set-up (4-bit
weights as shipped, no OpenBLAS) is measured the same way for the engine-setup ratio.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bench import systems
from bench.load import LoadResult, run_load
from bench.machine import describe
from bench.report import chart, table, write
from worker.gguf.default_model import KEEP, ensure_default_model
from worker.ops.cluster import environment


def engine_rows(model: Path, levels: list[int], max_tokens: int, blas: bool) -> dict[str, Any]:
    env = environment(**(systems.blas_env() if blas else {}))
    if not blas:
        env.pop("LD_PRELOAD", None)
    args = [sys.executable, "-m", "bench.engine_only", str(model), "--max-tokens", str(max_tokens)]
    args += ["--concurrency", ",".join(map(str, levels))]
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _as_row(system: str, concurrency: int, tokens_per_s: float, **extra: Any) -> dict[str, Any]:
    return {"system": system, "concurrency": concurrency, "tokens_per_s": tokens_per_s, **extra}


def _drive(label: str, running: systems.Running, c: int, args: Any) -> dict[str, Any]:
    cpu_before = systems.cpu_seconds(running.api_pids)
    result: LoadResult = run_load(
        label, running.port, running.model, c, args.per_client, args.max_tokens
    )
    api_cpu = systems.cpu_seconds(running.api_pids) - cpu_before
    row = result.as_dict()
    row["api_cpu_s_per_1k_tokens"] = 1000 * api_cpu / result.tokens if result.tokens else None
    return row


def run(args: Any) -> dict[str, Any]:
    levels = [int(c) for c in args.concurrency.split(",")]
    model = ensure_default_model(args.models_dir)
    rows: list[dict[str, Any]] = []
    with tqdm(total=2 * len(levels) + 2, desc="benchmark", unit="run") as bar:
        bar.set_postfix_str("engine alone")
        engine = engine_rows(model, levels, args.max_tokens, blas=True)
        for c in levels:
            rows.append(
                _as_row("engine (mlx-lm in-process)", c, engine[str(c)]["engine"]["tokens_per_s"])
            )
            rows.append(
                _as_row("forward step (ceiling)", c, engine[str(c)]["forward"]["tokens_per_s"])
            )
        bar.update()
        # Both stay up, idle while the other runs: at each level the peer and mlxq run back
        # to back, so a machine that slows down during the run weighs on both alike.
        with systems.peer(model) as peer, systems.mlxq(model, batch_size=max(levels)) as mlxq:
            for c in levels:
                for label, running in (("mlx_lm.server", peer), ("mlxq", mlxq)):
                    bar.set_postfix_str(f"{label} c={c}")
                    rows.append(_drive(label, running, c, args))
                    bar.update()
        bar.set_postfix_str("engine set-ups")
        setups = engine_setups(args) if not args.skip_naive else {}
        bar.update()
    return {"machine": describe(), "settings": vars_of(args), "rows": rows, "engine_setups": setups}


def engine_setups(args: Any) -> dict[str, Any]:
    """float32 + OpenBLAS vs the 4-bit weights as shipped with MLX's reference BLAS."""
    levels = [1, 16]
    fast = engine_rows(ensure_default_model(args.models_dir), levels, 16, blas=True)
    naive = engine_rows(ensure_default_model(args.models_dir, KEEP), levels, 16, blas=False)
    return {
        str(c): {
            "float32_openblas_tok_s": fast[str(c)]["engine"]["tokens_per_s"],
            "naive_4bit_tok_s": naive[str(c)]["engine"]["tokens_per_s"],
        }
        for c in levels
    }


def vars_of(args: Any) -> dict[str, Any]:
    return {k: str(v) for k, v in vars(args).items() if k != "func"}


def ratios(result: dict[str, Any]) -> list[str]:
    by = {(r["system"], r["concurrency"]): r for r in result["rows"]}
    lines = []
    for (system, c), row in sorted(by.items(), key=lambda kv: kv[0][1]):
        if system != "mlxq":
            continue
        peer = by.get(("mlx_lm.server", c))
        engine = by.get(("engine (mlx-lm in-process)", c))
        parts = [f"c={c}"]
        if peer and peer["tokens_per_s"]:
            parts.append(f"mlxq/peer tok/s = {row['tokens_per_s'] / peer['tokens_per_s']:.2f}")
            if row["ttft_p50_ms"] is not None and peer["ttft_p50_ms"] is not None:
                parts.append(
                    f"TTFT p50 mlxq-peer = {row['ttft_p50_ms'] - peer['ttft_p50_ms']:+.0f} ms"
                )
        if engine and engine["tokens_per_s"]:
            parts.append(f"mlxq/engine = {row['tokens_per_s'] / engine['tokens_per_s']:.2f}")
        if row.get("api_cpu_s_per_1k_tokens") is not None:
            parts.append(f"API CPU {row['api_cpu_s_per_1k_tokens']:.2f} s/1k tokens")
        lines.append(", ".join(parts))
    for c, s in result.get("engine_setups", {}).items():
        gain = s["float32_openblas_tok_s"] / s["naive_4bit_tok_s"]
        lines.append(f"c={c}: float32+OpenBLAS / naive 4-bit = {gain:.1f}x")
    return lines


def main(args: Any) -> None:
    result = run(args)
    out = Path(args.out)
    write(out, "serve", result)
    chart(
        result["rows"],
        out / "serve.png",
        f"mlxq vs mlx_lm.server vs engine ({result['machine']['summary']})",
    )
    text = table(result["rows"]) + "\n\n" + "\n".join(ratios(result))
    (out / "serve.md").write_text(f"Machine: {result['machine']['summary']}\n\n{text}\n")
    print(text)
