"""`mlxq batch ...` against the running stack, over HTTP, configured like the OpenAI SDK."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import openai

from tests.support import MODEL, wait_batch
from worker.ops.cluster import ROOT, wait_until

CHAT = "/v1/chat/completions"


def mlxq(api_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"OPENAI_BASE_URL": f"{api_url}/v1", "OPENAI_API_KEY": "unused", "PATH": "/usr/bin"}
    return subprocess.run(
        [sys.executable, "-m", "worker.ops.cli", "batch", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


def write_requests(path: Path, n: int, say: str = "Say {i}.", max_tokens: int = 6) -> None:
    lines = [
        {
            "custom_id": f"cli-{i}",
            "method": "POST",
            "url": CHAT,
            "body": {
                "model": MODEL,
                "messages": [{"role": "user", "content": say.format(i=i)}],
                "max_tokens": max_tokens,
            },
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_submit_wait_status_results_cancel(
    api_url: str, client: openai.OpenAI, tmp_path: Path
) -> None:
    requests = tmp_path / "in.jsonl"
    write_requests(requests, 3)
    submitted = mlxq(api_url, "submit", str(requests), "--wait")
    assert submitted.returncode == 0, submitted.stderr
    batch_id = submitted.stdout.splitlines()[0]
    assert batch_id.startswith("batch_")
    assert f"batch {batch_id}: completed" in submitted.stdout
    assert "3 total, 3 completed, 0 failed" in submitted.stdout
    assert "3/3" in submitted.stderr  # tqdm's progress bar, with counts and rate
    assert "req/s" in submitted.stderr

    status = mlxq(api_url, "status", batch_id)
    assert status.returncode == 0 and "completed" in status.stdout

    out = tmp_path / "out.jsonl"
    fetched = mlxq(api_url, "results", batch_id, "-o", str(out))
    assert fetched.returncode == 0, fetched.stderr
    ids = [json.loads(line)["custom_id"] for line in out.read_text().splitlines()]
    assert ids == ["cli-0", "cli-1", "cli-2"]

    cancelled = mlxq(api_url, "cancel", batch_id)
    assert cancelled.returncode == 0 and "completed" in cancelled.stdout  # it had ended


def test_cancel_a_running_batch_and_errors_are_reported(
    api_url: str, client: openai.OpenAI, tmp_path: Path
) -> None:
    requests = tmp_path / "in.jsonl"
    write_requests(requests, 30, "Write a long story about the number {i}.", max_tokens=300)
    submitted = mlxq(api_url, "submit", str(requests))
    assert submitted.returncode == 0, submitted.stderr
    batch_id = submitted.stdout.splitlines()[0]
    wait_until(lambda: "in_progress" in mlxq(api_url, "status", batch_id).stdout, 30, "running")
    cancelled = mlxq(api_url, "cancel", batch_id)
    assert cancelled.returncode == 0
    assert f"batch {batch_id}: cancel" in cancelled.stdout  # cancelling, or cancelled already
    assert wait_batch(client, batch_id, timeout_s=60).status == "cancelled"
    status = mlxq(api_url, "status", batch_id)
    assert status.returncode == 0 and f"batch {batch_id}: cancelled" in status.stdout
    done = client.batches.retrieve(batch_id).request_counts
    assert done is not None and done.completed < 30  # it stopped before the end
    missing = mlxq(api_url, "status", "batch_nope")
    assert missing.returncode == 2 and "404" in missing.stderr
