"""Ids of everything mlxq creates: OpenAI's prefix, then 128 random bits in hex.

The prefix carries its own separator, as OpenAI writes them: `chatcmpl-`, `cmpl-`, `file-`,
`resp_`, `batch_`. Every id matches shared/keys.py's ID_PATTERN, so it may name a Redis key.
"""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(16)}"
