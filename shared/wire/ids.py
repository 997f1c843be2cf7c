"""Ids of everything mlxq creates: OpenAI's prefix, then 128 random bits in hex.

The prefix carries its own separator, as OpenAI writes them: `chatcmpl-`, `cmpl-`, `file-`,
`resp_`, `batch_`. Every id matches ID_PATTERN, so it may name a Redis key (shared/queue/keys.py).
"""

from __future__ import annotations

import secrets

# A model name as served and requested: letters, digits and . _ : / - (hub ids have a slash).
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"
# A job, response, batch or file id: letters, digits, _ and -.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(16)}"
