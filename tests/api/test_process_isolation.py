"""The API process never imports mlx; the worker's modules never import flask."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A meta-path finder that makes any import of the named package fail loudly.
BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == {pkg!r} or name.startswith({pkg!r} + "."):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
"""


def run_blocked(pkg: str, code: str) -> subprocess.CompletedProcess[str]:
    script = BLOCK.format(pkg=pkg) + code
    return subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_api_app_builds_where_mlx_cannot_be_imported() -> None:
    result = run_blocked(
        "mlx",
        "import api, api.gunicorn_conf\napp = api.create_app()\n"
        "assert not any(m == 'mlx' or m.startswith('mlx') for m in sys.modules)\nprint('ok')",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_worker_modules_load_where_flask_cannot_be_imported() -> None:
    modules = [
        "runtime.serve",
        "engine.batch",
        "engine.prepare",
        "runtime.loop",
        "runtime.job_function",
        "runtime.intake.slots",
        "ops.stack",
        "ops.cli",
        "gguf.convert",
    ]
    imports = "\n".join(f"import worker.{m}" for m in modules)
    result = run_blocked("flask", imports + "\nprint('ok')")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
