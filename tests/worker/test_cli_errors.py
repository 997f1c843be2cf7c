"""`mlxq` given bad input: one line on stderr saying why, no traceback, a non-zero exit status.

Each case runs the real command line in a subprocess, as a user would, against a Redis port
nothing listens on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CASES = [
    (["import-gguf", "{tmp}/absent.gguf"], 1, "GGUF file not found"),
    (["import-gguf", "{tmp}/zip.gguf"], 1, "is not a GGUF file"),
    (["import-gguf", "{tmp}/zip.gguf", "--dtype", "q3"], 2, "invalid choice: 'q3'"),
    (["import-gguf"], 2, "the following arguments are required: file"),
    (["batch", "submit", "{tmp}/absent.jsonl"], 1, "No such file or directory"),
    (["status"], 1, "Redis: Error 111 connecting"),
    (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
]


@pytest.mark.parametrize(("argv", "status", "says"), CASES, ids=lambda c: str(c))
def test_bad_input_is_one_line_on_stderr_and_a_failing_exit_status(
    tmp_path: Path, argv: list[str], status: int, says: str
) -> None:
    (tmp_path / "zip.gguf").write_bytes(b"PK\x03\x04" + b"\0" * 64)
    env = {
        **os.environ,
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "MLXQ_MODELS_DIR": str(tmp_path / "models"),
        "OPENAI_BASE_URL": "http://127.0.0.1:1/v1",
    }
    args = [a.format(tmp=tmp_path) for a in argv]
    done = subprocess.run(
        [sys.executable, "-m", "worker.ops.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == status, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert says in lines[0] and lines[0].startswith("mlxq")
