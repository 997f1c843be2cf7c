"""`python -m bench MODE`: the benchmarks mlxq ships (docs/benchmarks.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from shared.queue.config import Settings

# The bench extra's modules. scripts/run.sh installs only what running needs, so after it the
# benchmarks' first import fails: one line saying what to install beats a traceback.
BENCH_EXTRA = ("matplotlib", "httpx", "httpx_sse")

try:
    from bench import (
        bulk,
        embed,
        health,
        intake,
        kv_quantization,
        model_switch,
        parity,
        placement,
        reasoning,
        relay,
        scale,
        serve,
    )
except ModuleNotFoundError as missing:
    if (missing.name or "").split(".")[0] not in BENCH_EXTRA:
        raise
    raise SystemExit(
        f"python -m bench needs the bench extra ({missing.name} is missing): "
        ".venv/bin/pip install -e '.[bench]'"
    ) from None

WORKLOADS_HELP = (
    "short (~40 prompt tokens), medium (~600), long (~2,000), multiturn, restart (a ~2,000-token "
    "conversation's next turn after a worker restart: the prefix cache's disk tier); and on a "
    "32k-window copy of the model: long16k and long30k (a document of that many tokens, then "
    "a short next turn), mixed (14 short requests alone, then with 2 long16k conversations); "
    "copying: repeat (a paragraph back word for word), edit (back with one word changed), "
    "edit-predicted (the same, the paragraph sent as OpenAI's `prediction`)"
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--out", default="bench/results", help="folder for JSON, PNG and table")
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve", help="mlxq vs mlx_lm.server vs vllm-mlx vs the forward step")
    s.add_argument(
        "--workloads", default="short,medium,long,multiturn,restart", help=WORKLOADS_HELP
    )
    s.add_argument("--concurrency", default="1,4,8,16", help="for the one-shot workloads")
    s.add_argument("--multiturn-concurrency", default="4")
    s.add_argument("--long-concurrency", default="1,4", help="for long16k and long30k")
    s.add_argument("--skip", default="", help="cells to leave out, e.g. long@16,medium@1")
    s.add_argument(
        "--systems", default="mlxq,mlx_lm.server,vllm-mlx,forward,engine,mlxq-kv8,mlxq-nospec"
    )
    s.add_argument("--repeats", type=int, default=1, help="each in another order of systems")
    s.add_argument("--max-tokens", type=int, default=48)
    s.add_argument("--per-client", type=int, default=2, help="one-shot requests each client sends")
    s.add_argument("--turns", type=int, default=4, help="requests of each conversation")
    s.add_argument("--vllm-mlx", help="vllm-mlx executable (else $MLXQ_BENCH_VLLM_MLX)")
    s.add_argument(
        "--mlxq-tuned",
        action="append",
        help="an extra mlxq row with these settings, e.g. MLXQ_PREFILL_TOKENS=64 (repeatable)",
    )
    s.add_argument("--name", default="serve", help="file name of the results under --out")
    s.set_defaults(func=serve.main)
    r = sub.add_parser("relay", help="one API process relaying a SYNTHETIC engine's tokens")
    r.add_argument("--streams", default="100,500")
    r.add_argument("--tokens", type=int, default=400, help="tokens per stream")
    r.add_argument("--step-ms", type=float, default=20.0, help="synthetic engine step")
    r.set_defaults(func=relay.main)
    c = sub.add_parser("scale", help="tokens/s through HTTP as SYNTHETIC workers are added")
    c.add_argument("--workers", default="1,2,4,8")
    c.add_argument("--slots", type=int, default=8, help="batch size of each worker")
    c.add_argument("--tokens", type=int, default=100, help="tokens per stream")
    c.add_argument("--step-ms", type=float, default=50.0, help="synthetic engine step")
    c.set_defaults(func=scale.main)
    q = sub.add_parser("parity", help="decode step: structured outputs, logprobs, penalties")
    q.add_argument("--rounds", type=int, default=3)
    q.set_defaults(func=parity.main)
    k = sub.add_parser("kv", help="quantized KV against float: accuracy, decode speed, memory")
    kv_quantization.add_arguments(k)
    k.set_defaults(func=kv_quantization.bench_main)
    b = sub.add_parser("bulk", help="a Batch API run on the default model, per worker batch size")
    b.add_argument("--batch-sizes", default="16,32,64")
    b.add_argument("--lines", type=int, default=1000)
    b.add_argument("--max-tokens", type=int, default=16)
    b.set_defaults(func=bulk.main)
    e = sub.add_parser("embed", help="embeddings: sentences/s through mlxq vs the bare forward")
    e.add_argument("--batch-sizes", default="1,8,32,64")
    e.add_argument("--sentences", type=int, default=256, help="sentences per measurement")
    e.add_argument("--rounds", type=int, default=3, help="runs per figure; the best is kept")
    e.set_defaults(func=embed.main)
    placement.add_parser(sub)
    intake.add_parser(sub)
    health.add_parser(sub)
    reasoning.add_parser(sub)
    model_switch.add_parser(sub)
    return p


def main() -> None:
    args = parser().parse_args()
    args.models_dir = Settings().models_dir
    args.out = Path(args.out)
    args.func(args)


if __name__ == "__main__":
    main()
