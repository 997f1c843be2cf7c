"""The tag that authenticates a lent prefix-cache file: made by the lender
(worker/runtime/prefix/prefix_lend.py), checked by the taker (prefix_fetch.py) before the file
goes into its disk tier.

Everything in a fleet meets in Redis, so without a tag anything that can write there could
answer an ask with KV of its own making, and the taker would load it into the prompt's cache
once its identity and arrays check out. With a fleet secret (MLXQ_FLEET_SECRET, read from the
environment only: never kept in Redis, where such a writer would read it) the lender sends an
HMAC-SHA256, under the secret, of the ask it answers (its reply id, the asker's identity, the
scope) and the file's bytes; the taker computes it again and compares in constant time. The
reply id is 128 random bits of the taker's own making, so an answer made for another ask, or a
file moved under another answer's header, fails. Without a secret nothing is tagged or checked.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Protocol

from pydantic import SecretStr

# What is tagged, in the message itself: a tag made under the same secret for anything else
# (another use, a later wire) never passes as a lent file's.
PURPOSE = b"mlxq prefix lend v1"


class Answered(Protocol):
    """What a tag binds a file to: the ask it answers (`Ask`)."""

    reply: str
    identity: str
    scope: str


class FleetKey:
    """The fleet secret, as the key that tags lent files and checks them."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @classmethod
    def configured(cls, secret: SecretStr | None) -> FleetKey | None:
        """The key of MLXQ_FLEET_SECRET; None where it is unset or empty (nothing tagged)."""
        return cls(secret.get_secret_value().encode()) if secret else None

    def tag(self, ask: Answered, data: bytes | memoryview) -> str:
        """The tag of `data` sent in answer to `ask` (64 hex digits)."""
        mac = hmac.new(self._secret, PURPOSE, hashlib.sha256)
        for field in (ask.reply, ask.identity, ask.scope):
            raw = field.encode()
            # Each field after its length: no two splits of the same bytes read alike.
            mac.update(len(raw).to_bytes(8, "big") + raw)
        mac.update(data)
        return mac.hexdigest()

    def verifies(self, ask: Answered, data: bytes | memoryview, tag: str | None) -> bool:
        """Whether `tag` is the one `data` in answer to `ask` carries under this secret."""
        if tag is None:
            return False
        # Bytes: compare_digest refuses a str that is not ASCII, and this tag came from Redis.
        return hmac.compare_digest(self.tag(ask, data).encode(), tag.encode())
