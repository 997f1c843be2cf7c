"""Files kept in Redis a chunk at a time and downloaded streamed (api/stores/files.py), on the
in-process app and a real Redis, with chunks of a few KiB (MLXQ_FILE_CHUNK_BYTES) so that a small
file is kept in several: no file needs one Redis value as large as itself, and a download yields
one chunk at a time, byte for byte what was written. A file kept whole, as before chunks, still
downloads. A file's lines read across chunks are its lines, however it is cut."""

from __future__ import annotations

import io

from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st
from redis import Redis

from api.stores.files import split_lines
from shared.queue.keys import Keys
from tests.support import SMALL_CHUNK as CHUNK
from tests.support import post_file


def download(http: FlaskClient, file_id: str) -> bytes:
    """The file's content, its streamed response closed once read."""
    with http.get(f"/v1/files/{file_id}/content") as reply:
        assert reply.status_code == 200, reply.get_data(as_text=True)
        return reply.get_data()


def chunks_kept(redis: Redis, keys: Keys, file_id: str) -> list[bytes]:
    """A file's content as Redis keeps it, chunk by chunk (and nothing kept whole)."""
    count = int(redis.hget(keys.file(file_id), "chunks") or 0)
    found = redis.hmget(keys.file(file_id), [f"chunk:{i}" for i in range(count)])
    assert None not in found and not redis.hexists(keys.file(file_id), "content")
    return [bytes(chunk) for chunk in found if chunk is not None]


def test_an_upload_is_kept_in_chunks_and_downloads_streamed_byte_for_byte(
    chunked: FlaskClient, redis: Redis, keys: Keys
) -> None:
    data = bytes(range(256)) * 50 + b"\n{}\n"  # 12,804 bytes: four chunks, the last short
    file_id = post_file(chunked, data).get_json()["id"]
    kept = chunks_kept(redis, keys, file_id)
    assert [len(chunk) for chunk in kept] == [CHUNK, CHUNK, CHUNK, len(data) - 3 * CHUNK]
    with chunked.get(f"/v1/files/{file_id}/content") as reply:
        assert reply.content_length == len(data)  # told before the first chunk is read
        pieces = list(reply.response)  # what the route yields: one Redis chunk at a time
    assert pieces == kept
    assert b"".join(pieces) == data


def test_a_file_kept_whole_before_chunks_still_downloads(
    chunked: FlaskClient, redis: Redis, keys: Keys
) -> None:
    data = b'{"kept": "whole"}\n' * 500
    file_id = post_file(chunked, data).get_json()["id"]
    key = keys.file(file_id)
    redis.hdel(key, "chunks", *(f"chunk:{i}" for i in range(-(-len(data) // CHUNK))))
    redis.hset(key, "content", data)  # as a file was written before chunks
    assert download(chunked, file_id) == data


def test_a_file_of_another_owner_or_none_is_a_404_before_any_byte(
    chunked: FlaskClient, redis: Redis, keys: Keys
) -> None:
    file_id = post_file(chunked, b"{}\n").get_json()["id"]
    redis.hset(keys.file(file_id), "owner", "someone-else")
    for missing in (file_id, "file-nope"):
        reply = chunked.get(f"/v1/files/{missing}/content")
        assert reply.status_code == 404
        assert reply.get_json()["error"]["param"] == "file_id"


@given(st.binary(max_size=80).map(lambda b: b.replace(b"\x00", b"\n")), st.data())
def test_a_files_lines_read_across_chunks_are_the_lines_of_its_content(
    content: bytes, data: st.DataObject
) -> None:
    """However the content is cut into chunks, its lines are what a binary file's would be."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(content)), max_size=6)))
    chunks = [content[a:b] for a, b in zip([0, *cuts], [*cuts, len(content)], strict=True)]
    assert list(split_lines(chunks)) == list(io.BytesIO(content))
