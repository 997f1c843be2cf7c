"""Files in Redis: one hash per file and a zset of ids per owner.

A file's hash holds `owner`, `object` (shared/wire/batch/files.py), `chunks` (how many) and its
content in fields `chunk:0`, `chunk:1`, ... of at most MLXQ_FILE_CHUNK_BYTES each, so no file
needs one value as large as itself (Redis caps a value at 512 MB), and a file is read back, or
written as it is made, a chunk at a time: a download streams (`read`), a batch's intake reads
lines (`lines`), a batch's finalizer writes its output as it goes (`FileWriter`), none holding
the whole file. A file written before chunks keeps its content in one field, `content`, and reads
as one chunk.

Any API process on any machine serves any file. A file lives for its TTL (MLXQ_BATCH_TTL_S,
or the upload's `expires_after`); a file of another owner is answered as if it did not exist.
Each file takes its place and bytes in its owner's quota (api/limits/quotas.py) before it is
written (a batch's output as it is completed: it is never refused), for as long as it lives. A
file being written has no `owner` or `object` yet: nobody sees it until it is whole.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from redis import Redis
from redis.client import Pipeline
from redis.typing import EncodableT, FieldT

from api.http.auth import is_owner
from api.limits.quotas import Quotas, Usage
from api.stores.listing import page
from shared.queue.config import Settings
from shared.queue.keys import Keys
from shared.wire.batch.files import FileDeleted, FileList, FileListQuery, FileObject, FilePurpose
from shared.wire.errors import NotFoundError
from shared.wire.ids import new_id

# The content of a file written before chunks.
_WHOLE = "content"


def _chunk(index: int) -> str:
    """The field of a file's hash that holds its chunk `index`."""
    return f"chunk:{index}"


def split_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of content that comes in `chunks`, each with its `\n` (the last maybe without),
    as a binary file's lines are; a line across chunks is joined once (linear, however long)."""
    pending: list[bytes] = []
    for chunk in chunks:
        *ends, rest = chunk.split(b"\n")
        for end in ends:
            pending.append(end)
            yield b"".join(pending) + b"\n"
            pending.clear()
        if rest:
            pending.append(rest)
    if pending:
        yield b"".join(pending)


class FileStore:
    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        default_ttl_s: int,
        quotas: Quotas,
        chunk_bytes: int = 4 * 1024 * 1024,
    ):
        self._redis = redis
        self._keys = keys
        self._default_ttl_s = default_ttl_s
        self._quotas = quotas
        self._chunk_bytes = chunk_bytes

    @classmethod
    def of(cls, redis: Redis, keys: Keys, settings: Settings, quotas: Quotas) -> FileStore:
        """The store as the settings set it up (MLXQ_BATCH_TTL_S, MLXQ_FILE_CHUNK_BYTES)."""
        return cls(redis, keys, settings.batch_ttl_s, quotas, settings.file_chunk_bytes)

    def create(
        self,
        owner: str,
        filename: str,
        purpose: FilePurpose,
        content: bytes,
        ttl_s: int | None = None,
    ) -> FileObject:
        """Write a file whose content is all here, in one step."""
        ttl_s = ttl_s or self._default_ttl_s
        obj = self.new_object(new_id("file-"), filename, purpose, len(content), ttl_s)
        pipe = self._redis.pipeline()
        step = self._chunk_bytes
        for index, start in enumerate(range(0, len(content), step)):
            self.put_chunk(pipe, obj.id, index, content[start : start + step], ttl_s)
        return self.publish(pipe, owner, obj, -(-len(content) // step), ttl_s)

    def writer(
        self, owner: str, filename: str, purpose: FilePurpose, ttl_s: int | None = None
    ) -> FileWriter:
        """A file written a piece at a time (`FileWriter`)."""
        return FileWriter(self, owner, filename, purpose, ttl_s or self._default_ttl_s)

    def new_object(
        self, file_id: str, filename: str, purpose: FilePurpose, size: int, ttl_s: int
    ) -> FileObject:
        """The object of a file of `size` bytes written now."""
        now = int(time.time())
        return FileObject(
            id=file_id,
            bytes=size,
            created_at=now,
            expires_at=now + ttl_s,
            filename=filename,
            purpose=purpose,
        )

    def pipeline(self) -> Pipeline:
        """A pipeline to write chunks on (`put_chunk`, `publish`)."""
        return self._redis.pipeline()

    @property
    def chunk_bytes(self) -> int:
        """The most bytes one chunk holds."""
        return self._chunk_bytes

    def put_chunk(self, pipe: Pipeline, file_id: str, index: int, data: bytes, ttl_s: int) -> None:
        """Write chunk `index` of a file not yet published (on `pipe`)."""
        key = self._keys.file(file_id)
        pipe.hset(key, _chunk(index), data)
        pipe.expire(key, ttl_s)

    def publish(
        self, pipe: Pipeline, owner: str, obj: FileObject, chunks: int, ttl_s: int
    ) -> FileObject:
        """Make a file whose `chunks` are written (or are on `pipe`) its owner's: it takes its
        place in the quota first (a batch's output is counted, never refused), then is seen."""
        usage = Usage("files", obj.id, size=obj.bytes, hold_s=ttl_s)
        if obj.purpose == "batch_output":  # the answer to work the key was let start
            self._quotas.count(owner, usage)
        else:
            self._quotas.take(owner, usage)
        key = self._keys.file(obj.id)
        fields: dict[FieldT, EncodableT] = {
            "owner": owner,
            "object": obj.model_dump_json(),
            "chunks": chunks,
        }
        pipe.hset(key, mapping=fields)
        pipe.expire(key, ttl_s)
        pipe.zadd(self._keys.files(owner), {obj.id: time.time()})
        pipe.expire(self._keys.files(owner), max(ttl_s, self._default_ttl_s))
        try:
            pipe.execute()
        except BaseException:
            self._quotas.release(owner, usage)
            self._redis.delete(key)
            raise
        return obj

    def discard(self, file_id: str) -> None:
        """Drop the chunks of a file that will not be published."""
        self._redis.delete(self._keys.file(file_id))

    def get(self, owner: str, file_id: str) -> FileObject:
        found = self._load([file_id], owner)[0]
        if found is None:
            raise NotFoundError(f"No such File object: {file_id}", param="file_id")
        return found

    def read(self, owner: str, file_id: str) -> tuple[FileObject, Iterator[bytes]]:
        """The file (a 404 now if it is not the owner's) and its content, read a chunk at a
        time as the iterator is."""
        found: Any = self._redis.hmget(self._keys.file(file_id), ["owner", "object", "chunks"])
        who, obj, chunks = found
        if who is None or obj is None or not is_owner(bytes(who).decode(), owner):
            raise NotFoundError(f"No such File object: {file_id}", param="file_id")
        fields = [_chunk(i) for i in range(int(chunks))] if chunks is not None else [_WHOLE]
        return FileObject.model_validate_json(obj), self._chunks(file_id, fields)

    def _chunks(self, file_id: str, fields: list[str]) -> Iterator[bytes]:
        key = self._keys.file(file_id)
        for field in fields:
            data: Any = self._redis.hget(key, field)
            if data is None:  # deleted, or expired, while it was read
                raise NotFoundError(f"No such File object: {file_id}", param="file_id")
            yield bytes(data)

    def lines(self, owner: str, file_id: str) -> Iterator[bytes]:
        """The file's lines (`split_lines`), read a chunk at a time; a 404 now if it is not the
        owner's."""
        return split_lines(self.read(owner, file_id)[1])

    def delete(self, owner: str, file_id: str) -> FileDeleted:
        self.get(owner, file_id)
        pipe = self._redis.pipeline()
        pipe.delete(self._keys.file(file_id))
        pipe.zrem(self._keys.files(owner), file_id)
        self._quotas.release(owner, Usage("files", file_id), pipe=pipe)
        pipe.execute()
        return FileDeleted(id=file_id)

    def listing(self, owner: str, query: FileListQuery) -> FileList:
        files, more = page(
            self._redis,
            self._keys.files(owner),
            query.after,
            query.limit,
            lambda ids: self._load(ids, owner),
            newest_first=query.order == "desc",
            keep=lambda f: query.purpose in (None, f.purpose),
        )
        return FileList(
            data=files,
            first_id=files[0].id if files else None,
            last_id=files[-1].id if files else None,
            has_more=more,
        )

    def _load(self, ids: list[str], owner: str) -> list[FileObject | None]:
        pipe = self._redis.pipeline(transaction=False)
        for file_id in ids:
            pipe.hmget(self._keys.file(file_id), ["owner", "object"])
        found: list[FileObject | None] = []
        for who, obj in pipe.execute():
            owned = who is not None and is_owner(bytes(who).decode(), owner) and obj is not None
            found.append(FileObject.model_validate_json(obj) if owned else None)
        return found


class FileWriter:
    """A file written as it is made (a batch's output), a chunk to Redis each time
    MLXQ_FILE_CHUNK_BYTES are in hand: it never holds more than one chunk. Unseen until `close`
    publishes it; `discard` drops what was written of one that will not be."""

    def __init__(
        self, store: FileStore, owner: str, filename: str, purpose: FilePurpose, ttl_s: int
    ):
        self._store = store
        self._owner = owner
        self._filename = filename
        self._purpose = purpose
        self._ttl_s = ttl_s
        self.id = new_id("file-")
        self._pending = bytearray()
        self._chunks = 0
        self.size = 0

    def write(self, data: bytes) -> None:
        self._pending += data
        self.size += len(data)
        step = self._store.chunk_bytes
        while len(self._pending) >= step:
            self._flush(bytes(self._pending[:step]))
            del self._pending[:step]

    def _flush(self, chunk: bytes) -> None:
        pipe = self._store.pipeline()
        self._store.put_chunk(pipe, self.id, self._chunks, chunk, self._ttl_s)
        pipe.execute()
        self._chunks += 1

    def close(self) -> FileObject:
        """Write what is left and publish the file."""
        pipe = self._store.pipeline()
        if self._pending:
            self._store.put_chunk(pipe, self.id, self._chunks, bytes(self._pending), self._ttl_s)
            self._chunks += 1
            self._pending.clear()
        obj = self._store.new_object(self.id, self._filename, self._purpose, self.size, self._ttl_s)
        return self._store.publish(pipe, self._owner, obj, self._chunks, self._ttl_s)

    def discard(self) -> None:
        self._store.discard(self.id)
