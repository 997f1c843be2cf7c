"""Files in Redis: one hash per file (owner, object, content) and a zset of ids per owner.

Any API process on any machine serves any file. A file lives for its TTL (MLXQ_BATCH_TTL_S,
or the upload's `expires_after`); a file of another owner is answered as if it did not exist.
Each file takes its place and bytes in its owner's quota (api/limits/quotas.py) before it is
written, for as long as it lives.
"""

from __future__ import annotations

import time
from typing import Any

from redis import Redis

from api.http.auth import is_owner
from api.limits.quotas import Quotas, Usage
from api.stores.listing import page
from shared.queue.keys import Keys
from shared.wire.batch.files import FileDeleted, FileList, FileListQuery, FileObject, FilePurpose
from shared.wire.errors import NotFoundError
from shared.wire.ids import new_id


class FileStore:
    def __init__(self, redis: Redis, keys: Keys, default_ttl_s: int, quotas: Quotas):
        self._redis = redis
        self._keys = keys
        self._default_ttl_s = default_ttl_s
        self._quotas = quotas

    def create(
        self,
        owner: str,
        filename: str,
        purpose: FilePurpose,
        content: bytes,
        ttl_s: int | None = None,
    ) -> FileObject:
        ttl_s = ttl_s or self._default_ttl_s
        now = int(time.time())
        obj = FileObject(
            id=new_id("file-"),
            bytes=len(content),
            created_at=now,
            expires_at=now + ttl_s,
            filename=filename,
            purpose=purpose,
        )
        usage = Usage("files", obj.id, size=len(content), hold_s=ttl_s)
        if purpose == "batch_output":  # the answer to work the key was let start: never refused
            self._quotas.count(owner, usage)
        else:
            self._quotas.take(owner, usage)
        key = self._keys.file(obj.id)
        pipe = self._redis.pipeline()
        pipe.hset(
            key, mapping={"owner": owner, "object": obj.model_dump_json(), "content": content}
        )
        pipe.expire(key, ttl_s)
        pipe.zadd(self._keys.files(owner), {obj.id: time.time()})
        pipe.expire(self._keys.files(owner), max(ttl_s, self._default_ttl_s))
        try:
            pipe.execute()
        except BaseException:
            self._quotas.release(owner, usage)
            raise
        return obj

    def get(self, owner: str, file_id: str) -> FileObject:
        found = self._load([file_id], owner)[0]
        if found is None:
            raise NotFoundError(f"No such File object: {file_id}", param="file_id")
        return found

    def content(self, owner: str, file_id: str) -> bytes:
        self.get(owner, file_id)
        data: Any = self._redis.hget(self._keys.file(file_id), "content")
        if data is None:
            raise NotFoundError(f"No such File object: {file_id}", param="file_id")
        return bytes(data)

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
