"""`python -m bench parity`: the decode step's cost with structured outputs, logprobs and
penalties against the plain step, in one run (bench/step_cost.py does the measuring)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.machine import describe
from bench.report import write
from worker.gguf.default_model import ensure_default_model
from worker.ops.cluster import environment
from worker.runtime.blas import openblas_env


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario (16 sequences) | steps timed | median step ms | vs plain |",
        "| --- |" * 1 + " --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['scenario']} | {r['steps']} | {r['step_ms']:.1f} | {r['vs_plain']:.2f}x |"
        )
    return "\n".join(lines)


def main(args: Any) -> None:
    model = ensure_default_model(args.models_dir)
    command = [sys.executable, "-m", "bench.step_cost", str(model), "--rounds", str(args.rounds)]
    env = environment(**openblas_env())
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["machine"] = describe()
    write(Path(args.out), "parity", result)
    n4 = result["n4_prefill"]
    text = table(result["rows"]) + (
        f"\n\nn=4 on a {n4['prompt']}-token prompt: {n4['computed']} prompt tokens computed "
        f"for {n4['requested']} requested."
    )
    (Path(args.out) / "parity.md").write_text(
        f"Machine: {result['machine']['summary']}\n\n{text}\n"
    )
    print(text)
