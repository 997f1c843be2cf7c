"""`mlxq batch ...`: a Batch API client over HTTP, so it works from any machine.

It is the OpenAI SDK (files, batches, retries, error bodies), pointed by the SDK's own
environment: OPENAI_BASE_URL (default here: the local API at MLXQ_API_BIND) and OPENAI_API_KEY.
Its answers are read into mlxq's own wire models; the progress bar is tqdm's.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import openai

from shared.wire.batch.batches import Batch
from shared.wire.batch.files import FileObject

FINAL = ("completed", "failed", "expired", "cancelled")
T = TypeVar("T")


class ApiError(Exception):
    """The API answered an error (its OpenAI error message), or could not be reached."""


class BatchClient:
    def __init__(self, base_url: str, api_key: str | None, timeout_s: float = 60.0):
        # With API keys off the server ignores the header; the SDK insists on one.
        self._sdk = openai.OpenAI(
            base_url=base_url, api_key=api_key or "unused", timeout=timeout_s, max_retries=2
        )

    @classmethod
    def from_env(cls, default_bind: str) -> BatchClient:
        base = os.environ.get("OPENAI_BASE_URL") or f"http://{default_bind}/v1"
        return cls(base, os.environ.get("OPENAI_API_KEY") or None)

    def upload(self, path: Path) -> FileObject:
        with path.open("rb") as f:
            created = _call(lambda: self._sdk.files.create(file=(path.name, f), purpose="batch"))
        return FileObject.model_validate(created.model_dump())

    def create(self, file_id: str, endpoint: str) -> Batch:
        created = _call(
            lambda: self._sdk.batches.create(
                input_file_id=file_id,
                endpoint=endpoint,  # type: ignore[arg-type]
                completion_window="24h",
            )
        )
        return Batch.model_validate(created.model_dump())

    def get(self, batch_id: str) -> Batch:
        return Batch.model_validate(
            _call(lambda: self._sdk.batches.retrieve(batch_id)).model_dump()
        )

    def cancel(self, batch_id: str) -> Batch:
        return Batch.model_validate(_call(lambda: self._sdk.batches.cancel(batch_id)).model_dump())

    def content(self, file_id: str) -> bytes:
        return _call(lambda: self._sdk.files.content(file_id)).content


def _call(request: Callable[[], T]) -> T:
    try:
        return request()
    except openai.APIStatusError as err:
        raise ApiError(f"{err.status_code}: {_message(err.body)}") from err
    except openai.APIError as err:
        raise ApiError(f"cannot reach the API: {err.message}") from err


def _message(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return str(body)[:200]


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
    # A batch is `validating` until its intake process has checked its first lines.
    return 0 if batch.status in ("validating", "in_progress", "finalizing", "completed") else 1


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
