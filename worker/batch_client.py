"""`mlxq batch ...`: a Batch API client over HTTP, so it works from any machine.

It speaks only the OpenAI routes (/v1/files, /v1/batches) and reads the OpenAI SDK's
environment: OPENAI_BASE_URL (default: the local API at MLXQ_API_BIND) and OPENAI_API_KEY
(sent as a bearer token when set). HTTP is the standard library's; the progress bar is tqdm's.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from shared.batches import Batch
from shared.files import FileObject

FINAL = ("completed", "failed", "expired", "cancelled")


class ApiError(Exception):
    """The API answered an error (its OpenAI error message), or could not be reached."""


class BatchClient:
    def __init__(self, base_url: str, api_key: str | None, timeout_s: float = 60.0):
        self._base = base_url.rstrip("/")
        self._api_key = api_key
        self._timeout_s = timeout_s

    @classmethod
    def from_env(cls, default_bind: str) -> BatchClient:
        base = os.environ.get("OPENAI_BASE_URL") or f"http://{default_bind}/v1"
        return cls(base, os.environ.get("OPENAI_API_KEY") or None)

    def _call(
        self, method: str, path: str, body: bytes | None = None, content_type: str | None = None
    ) -> bytes:
        req = urllib.request.Request(f"{self._base}{path}", data=body, method=method)
        if content_type:
            req.add_header("Content-Type", content_type)
        if self._api_key:
            req.add_header("Authorization", f"Bearer {self._api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self._timeout_s) as response:
                data: bytes = response.read()
                return data
        except urllib.error.HTTPError as err:
            raise ApiError(f"{err.code}: {_error_message(err.read())}") from err
        except OSError as err:
            raise ApiError(f"cannot reach {self._base}: {err}") from err

    def _json(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        body = json.dumps(payload).encode() if payload is not None else None
        return json.loads(self._call(method, path, body, "application/json" if body else None))

    def upload(self, path: Path) -> FileObject:
        boundary = secrets.token_hex(16)
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f"--{boundary}\r\nContent-Disposition: form-data; "
            f'name="file"; filename="{path.name}"\r\n'
            "Content-Type: application/jsonl\r\n\r\n"
        ).encode()
        body = head + path.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
        data = self._call("POST", "/files", body, f"multipart/form-data; boundary={boundary}")
        return FileObject.model_validate_json(data)

    def create(self, file_id: str, endpoint: str) -> Batch:
        payload = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"}
        return Batch.model_validate(self._json("POST", "/batches", payload))

    def get(self, batch_id: str) -> Batch:
        return Batch.model_validate(self._json("GET", f"/batches/{batch_id}"))

    def cancel(self, batch_id: str) -> Batch:
        return Batch.model_validate(self._json("POST", f"/batches/{batch_id}/cancel"))

    def content(self, file_id: str) -> bytes:
        return self._call("GET", f"/files/{file_id}/content")


def _error_message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")[:200]


def endpoint_of(path: Path) -> str:
    """The url of the file's first request: a batch has one endpoint."""
    with path.open("rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    return str(json.loads(raw)["url"])
                except (ValueError, KeyError, TypeError) as err:
                    raise ApiError(f"{path}: the first line is not a batch request") from err
    raise ApiError(f"{path} has no requests")


def wait(client: BatchClient, batch: Batch, poll_s: float = 1.0) -> Batch:
    """Poll until the batch ends, with a progress bar of its counts and rate."""
    from tqdm import tqdm

    counts = batch.request_counts
    with tqdm(total=counts.total, unit="req", desc=batch.id, dynamic_ncols=True) as bar:
        while True:
            counts = batch.request_counts
            bar.total = counts.total
            bar.update(counts.completed + counts.failed - bar.n)
            bar.set_postfix(status=batch.status, failed=counts.failed)
            if batch.status in FINAL:
                return batch
            time.sleep(poll_s)
            batch = client.get(batch.id)


def summary(batch: Batch) -> str:
    counts = batch.request_counts
    lines = [
        f"batch {batch.id}: {batch.status}",
        f"  requests: {counts.total} total, {counts.completed} completed, {counts.failed} failed",
    ]
    if batch.output_file_id:
        lines.append(f"  output file: {batch.output_file_id}")
    if batch.error_file_id:
        lines.append(f"  error file: {batch.error_file_id}")
    for error in batch.errors.data if batch.errors else []:
        where = f"line {error.line}: " if error.line else ""
        lines.append(f"  error {error.code}: {where}{error.message}")
    return "\n".join(lines)


def submit(client: BatchClient, path: Path, endpoint: str | None, and_wait: bool) -> int:
    uploaded = client.upload(path)
    batch = client.create(uploaded.id, endpoint or endpoint_of(path))
    print(batch.id, flush=True)
    if and_wait:
        batch = wait(client, batch)
    print(summary(batch), flush=True)
    return 0 if batch.status in ("completed", "in_progress", "finalizing") else 1


def results(client: BatchClient, batch_id: str, out: Path, errors: Path | None) -> int:
    batch = client.get(batch_id)
    if batch.status not in FINAL:
        print(f"batch {batch_id} is {batch.status}: no results yet", file=sys.stderr)
        return 1
    out.write_bytes(client.content(batch.output_file_id) if batch.output_file_id else b"")
    print(f"{batch.request_counts.completed} results -> {out}")
    if batch.error_file_id:
        if errors is None:
            print(
                f"{batch.request_counts.failed} failed: see --errors (file {batch.error_file_id})"
            )
        else:
            errors.write_bytes(client.content(batch.error_file_id))
            print(f"{batch.request_counts.failed} errors -> {errors}")
    return 0
