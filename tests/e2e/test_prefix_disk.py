"""The prefix cache's disk tier across a worker restart, on real worker processes.

One worker answers four conversations' first turns and stops (SIGTERM: it writes what its cache
holds). Before a second worker starts on the same folder, the files of three of them are spoiled
as a disk can spoil them: one truncated, one made another model's, one cast to another dtype.
The second worker then serves the four next turns. Two worker processes in all, on the session's
Redis under a namespace of their own; requests go through the in-process app.
"""

from __future__ import annotations

import secrets
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from flask.testing import FlaskClient
from tokenizers import Tokenizer

from api import create_app
from shared.queue.config import Settings
from tests.support import CHAT, MODEL, REAL_ENGINE
from worker.ops.cluster import Cluster, Worker

HEARTBEAT_S = 0.5
# About 150 tokens of system prompt: two full blocks of shared/queue/prefix/prefix_blocks.py.
FILLER = (
    "You answer questions about the weather, the sea and the mountains. You keep every answer "
    "short, you never guess, and when you do not know you say so plainly. "
) * 4
SPOILED = ("truncated", "foreign", "float16")


@dataclass
class Conversation:
    nonce: str
    first: dict[str, Any]  # the first turn's answer

    def messages(self, turn: int) -> list[dict[str, str]]:
        system = f"You are assistant {self.nonce}. {FILLER}"
        said = [{"role": "system", "content": system}, {"role": "user", "content": "Hello."}]
        if turn == 1:
            return said
        answer = self.first["choices"][0]["message"]["content"]
        return [
            *said,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "Bye."},
        ]


@dataclass
class Restart:
    """What the module's two workers did: the conversations (plain first, then the spoiled
    ones in SPOILED's order), the second worker, and the files as it started."""

    http: FlaskClient
    cluster: Cluster
    second: Worker
    conversations: list[Conversation]
    spoiled: dict[str, Path]
    folder: Path


def _ask(http: FlaskClient, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0}
    reply = http.post(CHAT, json=body)
    assert reply.status_code == 200, reply.get_json()
    answer: dict[str, Any] = reply.get_json()
    return answer


def _cached(answer: dict[str, Any]) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


def _file_of(folder: Path, nonce: str, tokenizer: Tokenizer) -> Path:
    """The one file whose tokens hold the conversation's nonce."""
    found = []
    for path in folder.glob("*.safetensors"):
        _, meta = mx.load(str(path), return_metadata=True)
        assert isinstance(meta, dict)
        tokens = [int(t) for t in meta["0.tokens"].split(",")]
        if nonce in tokenizer.decode(tokens):
            found.append(path)
    assert len(found) == 1, found
    return found[0]


def _spoil(path: Path, how: str) -> None:
    if how == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return
    arrays, meta = mx.load(str(path), return_metadata=True)
    assert isinstance(arrays, dict) and isinstance(meta, dict)
    if how == "foreign":  # as another model's worker wrote it, then moved here
        meta = {**meta, "0.identity": "another-model-0123456789abcdef"}
    else:
        arrays = {k: v.astype(mx.float16) if v.ndim == 4 else v for k, v in arrays.items()}
    mx.save_safetensors(str(path), arrays, meta)


@pytest.fixture(scope="module")
def restart(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Restart]:
    root = tmp_path_factory.mktemp("prefix-cache")
    env = {**REAL_ENGINE, "MLXQ_PREFIX_CACHE_DIR": str(root), "MLXQ_PREFIX_CACHE_DISK_MB": "512"}
    namespace = "mlxqprefixdisk"
    cluster = Cluster(
        namespace, HEARTBEAT_S, MODEL, env=env, logs=tmp_path_factory.mktemp("logs"), url=redis_url
    )
    settings = Settings(redis_url=redis_url, namespace=namespace, heartbeat_s=HEARTBEAT_S)
    http = create_app(settings).test_client()
    try:
        first = cluster.start_worker(MLXQ_BATCH_SIZE="4")
        nonces = [secrets.token_hex(4) for _ in range(1 + len(SPOILED))]
        conversations = [
            Conversation(n, _ask(http, Conversation(n, {}).messages(1))) for n in nonces
        ]
        cluster.kill_worker(first, signal.SIGTERM)
        (folder,) = [p for p in root.iterdir() if p.is_dir()]  # beside it: weights.json
        tokenizer = Tokenizer.from_file(str(settings.models_dir / MODEL / "tokenizer.json"))
        spoiled = {
            how: _file_of(folder, c.nonce, tokenizer)
            for how, c in zip(SPOILED, conversations[1:], strict=True)
        }
        for how, path in spoiled.items():
            _spoil(path, how)
        second = cluster.start_worker(MLXQ_BATCH_SIZE="4")
        yield Restart(http, cluster, second, conversations, spoiled, folder)
    finally:
        cluster.stop()


def test_a_restarted_worker_serves_the_next_turn_from_the_cache_written_at_shutdown(
    restart: Restart,
) -> None:
    conversation = restart.conversations[0]
    first_prompt = conversation.first["usage"]["prompt_tokens"]
    answer = _ask(restart.http, conversation.messages(2))
    # The whole first turn, prompt and answer, was restored (less the last token, recomputed).
    assert _cached(answer) >= first_prompt


def test_a_restarted_worker_advertises_what_its_files_hold(restart: Restart) -> None:
    blocks = restart.cluster.redis().smembers(
        restart.cluster.keys.prefix_blocks(restart.second.worker_id)
    )
    assert len(blocks) >= 2  # at least the first conversation's two full blocks


@pytest.mark.parametrize("how", SPOILED)
def test_a_spoiled_file_is_never_loaded_and_the_request_still_succeeds(
    restart: Restart, how: str
) -> None:
    conversation = restart.conversations[1 + SPOILED.index(how)]
    answer = _ask(restart.http, conversation.messages(2))
    assert answer["choices"][0]["finish_reason"] in ("stop", "length")
    # Only the template's opening, shared with the other conversations, can be cached.
    assert _cached(answer) < 16
    assert not restart.spoiled[how].exists()  # removed, not left to fail again
