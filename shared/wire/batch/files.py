"""Wire formats of /v1/files: the file object, its list page, the deletion answer.

Files live in Redis (keys.py: `file`, `files`), so any API process on any machine serves them.
Uploads take purpose "batch" only; a batch's output and error files have purpose "batch_output".
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from shared.wire.ids import ID_PATTERN

FilePurpose = Literal["batch", "batch_output"]


class ExpiresAfter(BaseModel):
    """An upload's `expires_after[anchor]` and `expires_after[seconds]` form fields."""

    anchor: Literal["created_at"]
    seconds: int = Field(ge=3600, le=30 * 24 * 3600)


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None = None
    filename: str
    purpose: FilePurpose
    status: Literal["processed"] = "processed"
    status_details: None = None


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class FileListQuery(BaseModel):
    """The query of GET /v1/files."""

    model_config = ConfigDict(extra="forbid")

    after: Annotated[str, Field(pattern=ID_PATTERN)] | None = None
    limit: int = Field(default=10_000, ge=1, le=10_000)
    order: Literal["asc", "desc"] = "desc"
    purpose: FilePurpose | None = None


class FileUpload(BaseModel):
    """The multipart form of POST /v1/files (described in /openapi.json; read by
    api/routes/batch/files.py)."""

    model_config = ConfigDict(populate_by_name=True)

    file: bytes = Field(json_schema_extra={"format": "binary"})
    purpose: Literal["batch"]
    # Both or neither: the file lives this long after its upload (default MLXQ_BATCH_TTL_S).
    expires_after_anchor: Literal["created_at"] | SkipJsonSchema[None] = Field(
        default=None, alias="expires_after[anchor]"
    )
    expires_after_seconds: int | SkipJsonSchema[None] = Field(
        default=None, ge=3600, le=30 * 24 * 3600, alias="expires_after[seconds]"
    )
