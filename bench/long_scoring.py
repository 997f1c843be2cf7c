"""Issue 42's target: one key scores many long prompts while another key chats.

One key sends `/v1/completions` with `echo: true, logprobs: 1, max_tokens: 1` and `--prompts`
prompts of about `--tokens` tokens each; `--chat-after` seconds later another key sends an
8-token chat. Measured on a private cluster of one worker with shipped defaults (the watchdog's
60 s included): the chat's answer time, the big request's, their statuses, and whether the
worker is still up. `--root` runs another checkout's code (a "before").

`python -m bench.long_scoring [--prompts 16] [--tokens 3600] [--root DIR]`
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from worker.gguf.default_model import DEFAULT_MODEL_NAME
from worker.ops.cluster import ROOT, Cluster

KEYS = ("sk-mlxq-bench-scorer-5e1f", "sk-mlxq-bench-chatter-9a27")
CHAT = [{"role": "user", "content": "Name a colour."}]


def long_prompt(k: int, tokens: int) -> str:
    """About `tokens` tokens of the default model, a text of its own (17-18 tokens a line)."""
    lines = tokens * 10 // 177
    return " ".join(f"Line {i} of list {k}: the {k}th river meets the sea." for i in range(lines))


def timed_post(url: str, key: str, body: dict[str, Any]) -> tuple[int, float, Any]:
    started = time.monotonic()
    reply = httpx.post(url, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=3600)
    return reply.status_code, time.monotonic() - started, reply.json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=3600)
    parser.add_argument("--chat-after", type=float, default=5.0)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to run")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="long-scoring-"))
    env = {"MLXQ_API_KEYS": ",".join(KEYS), "MLXQ_ENGINE": "mlx"}
    cluster = Cluster("mlxqbenchscoring", 2.0, env=env, logs=logs, root=args.root).start(1)
    try:
        api = cluster.api_url
        timed_post(f"{api}/v1/chat/completions", KEYS[1], _chat(2))  # warm up
        scored = {
            "model": DEFAULT_MODEL_NAME,
            "prompt": [long_prompt(k, args.tokens) for k in range(args.prompts)],
            "echo": True,
            "logprobs": 1,
            "max_tokens": 1,
            "temperature": 0,
        }
        with ThreadPoolExecutor(1) as pool:
            big = pool.submit(timed_post, f"{api}/v1/completions", KEYS[0], scored)
            time.sleep(args.chat_after)
            chat_status, chat_s, chat = timed_post(f"{api}/v1/chat/completions", KEYS[1], _chat(8))
            big_status, big_s, reply = big.result()
        try:  # a wedged worker hands its jobs back first, then exits
            up = f"no, it exited with status {cluster.workers[0].proc.wait(timeout=10)}"
        except subprocess.TimeoutExpired:
            up = "yes"
        tokens = reply.get("usage", {}).get("prompt_tokens") if big_status == 200 else None
        print(f"code: {args.root}; logs: {logs}")
        print("| request | status | seconds | detail |")
        print("| --- | --- | --- | --- |")
        error = chat.get("error", {}).get("code", "")
        print(f"| 8-token chat (key B) | {chat_status} | {chat_s:.1f} | {error} |")
        detail = f"{tokens} prompt tokens" if tokens else reply.get("error", {}).get("code", "")
        print(f"| {args.prompts} scored prompts (key A) | {big_status} | {big_s:.1f} | {detail} |")
        print(f"worker still up: {up}")
    finally:
        cluster.stop(quick=True)


def _chat(max_tokens: int) -> dict[str, Any]:
    return {"model": DEFAULT_MODEL_NAME, "messages": CHAT, "max_tokens": max_tokens}


if __name__ == "__main__":
    main()
