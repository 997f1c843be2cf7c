"""`python -m bench MODE`: the benchmarks mlxq ships (README, Benchmarks)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench import bulk, embed, parity, placement, relay, scale, serve
from shared.queue.config import Settings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--out", default="bench/results", help="folder for JSON, PNG and table")
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve", help="engine vs mlx_lm.server vs mlxq, streaming clients")
    s.add_argument("--concurrency", default="1,4,16,32")
    s.add_argument("--max-tokens", type=int, default=64)
    s.add_argument("--per-client", type=int, default=4, help="requests each client sends")
    s.add_argument("--skip-naive", action="store_true", help="skip the 4-bit/no-OpenBLAS runs")
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
    return p


def main() -> None:
    args = parser().parse_args()
    args.models_dir = Settings().models_dir
    args.out = Path(args.out)
    args.func(args)


if __name__ == "__main__":
    main()
