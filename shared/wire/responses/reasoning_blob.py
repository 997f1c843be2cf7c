"""The opaque value that carries a model's reasoning out to a client and back in.

The Responses API answers `include: ["reasoning.encrypted_content"]` with a reasoning item's
`encrypted_content`, and a client that goes on with the conversation sends the item back as
input (Codex always does, with `store: false`). mlxq stores nothing for it, so the value holds
the reasoning itself: `mlxq1.` then base64url (unpadded) of `{"v": 1, "text": reasoning}` as
JSON. It is opaque to clients, not secret: it says what the client already received. Anything
else sent back (another server's ciphertext, a value cut short) reads as None and is ignored.
"""

from __future__ import annotations

import base64
import binascii
import json

PREFIX = "mlxq1."
VERSION = 1


def encode_reasoning_blob(text: str) -> str:
    """The opaque value of a reasoning text."""
    payload = json.dumps({"v": VERSION, "text": text}, ensure_ascii=False, separators=(",", ":"))
    return PREFIX + base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")


def decode_reasoning_blob(blob: str) -> str | None:
    """The reasoning text an opaque value carries; None for a value this server did not make."""
    if not blob.startswith(PREFIX):
        return None
    data = blob.removeprefix(PREFIX)
    try:
        raw = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
        payload = json.loads(raw)
    except (binascii.Error, ValueError, RecursionError):  # not base64, UTF-8, or sane JSON
        return None
    if not isinstance(payload, dict) or payload.get("v") != VERSION:
        return None
    text = payload.get("text")
    return text if isinstance(text, str) else None
