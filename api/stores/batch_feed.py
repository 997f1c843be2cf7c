"""A batch's intake process: reads the batch's input as a stream and queues its lines as they
pass (api/stores/batch_intake.py), in a process of its own, never on the API's hub.

Creating a batch (api/stores/batches.py) writes it `validating` and `launch`es this process with an
`IntakeOrder`, then answers (a message batch once this process has parsed its request body, so that
a body that is not one is still the create's 400: `verdict`). The process reads the input file (or
a message batch's requests), checks each line, and every CHUNK_LINES lines takes their queued
tokens (a key with that limit: api/limits/rates.py `BatchHold`), records them (the first chunk
moves the batch to `in_progress`) and queues their jobs, so workers run the first lines while later
ones are still being read. A line past MLXQ_BATCH_MAX_LINES (OpenAI's 50,000), or an input over
MAX_INPUT_BYTES, fails the batch as it is reached. A batch that fails validation stops queuing at
its first error, reads on to name each problem (at most MAX_ERRORS), and is then `failed`: its
queued lines dropped, its running ones stopped. A batch cancelled meanwhile stops its intake at the
next chunk.

Why a process (started as api/stores/batch_process.py starts one): pure-Python parsing and
pydantic validation hold the GIL, so intake work in a thread of the API process delays each
wake-up of the hub (measured: 250-300 ms at p99, seconds at worst, against 20-57 ms p99 from a
subprocess; docs/benchmarks.md, "Batch intake"). A process of its own leaves the API process's
core to its streams (at a lower priority, it yields the CPU to them), costs one interpreter start
(about 1.5 s on a loaded 2-core machine) per batch, and needs no other process to be deployed.
While it runs it renews the batch's `intake_until` each chunk; a batch whose intake died (its API
host went away) is failed by the next reader once that time has passed.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import ValidationError

from api.http.errors import validation_detail
from api.http.validation import parse_json
from api.limits.quotas import Quotas
from api.limits.rates import BatchEntry, BatchHold, RateLimiter
from api.queue.broker import standalone
from api.stores.batch_intake import MAX_ERRORS, Intake, LineModels
from api.stores.batch_process import launch as launch_process
from api.stores.batch_process import read_order
from api.stores.batch_queue import BatchQueue
from api.stores.files import FileStore
from shared.observe.logs import configure
from shared.queue.config import Settings
from shared.wire.anthropic.message_batches import MessageBatchCreate
from shared.wire.batch.batches import MAX_INPUT_BYTES, BatchError, StoredBatch
from shared.wire.errors import (
    ErrorDetail,
    InvalidRequestError,
    MLXQError,
    ModelNotFoundError,
    RateLimitError,
)

log = logging.getLogger(__name__)

# Lines checked, then recorded and queued, at a time.
CHUNK_LINES = 500
# How long an intake may go without a sign of life before a reader fails its batch.
LEASE_S = 60
# What the intake process says once a message batch's body is parsed.
_PARSED = b"parsed"


@dataclass(frozen=True)
class IntakeOrder:
    """What the API hands a batch's intake process (pickled on its stdin: settings included)."""

    settings: Settings
    owner: str
    cache_scope: str  # the owner's key's (api/http/auth.py): each line's job carries it
    stored: StoredBatch
    # Where the lines are: the input file's id, or (a message batch) empty, and `requests` its
    # request body, unparsed: the process parses it and tells the waiting request (`verdict`).
    file_id: str
    queued_limit: int | None  # the owner's queued-token limit, if it has one
    requests: bytes | None = None


def launch(order: IntakeOrder) -> subprocess.Popen[bytes]:
    """Start the batch's intake process (a message batch's answers `verdict` on its stdout)."""
    return launch_process(__name__, order, answers=order.requests is not None)


def verdict(process: subprocess.Popen[bytes]) -> None:
    """Wait (without the hub: the process parses) until a message batch's intake has parsed
    its request body; its 400 if the body is not a message batch."""
    assert process.stdout is not None
    with process.stdout:
        line = process.stdout.readline()
    if line.strip() == _PARSED:
        return
    if not line:
        raise MLXQError("The batch's requests could not be read; please try again.")
    detail = ErrorDetail.model_validate_json(line)
    raise InvalidRequestError(detail.message, param=detail.param, code=detail.code)


class Feed:
    def __init__(self, order: IntakeOrder):
        self._order = order
        self._stored = order.stored
        self._broker = b = standalone(order.settings)
        self._roster = b.roster
        self._keys = b.keys
        self._lines = BatchQueue(b)
        self._hold: BatchHold | None = None
        self._requests: MessageBatchCreate | None = None  # a message batch's, once read
        if order.queued_limit is not None:
            stored = order.stored
            entry = BatchEntry(order.owner, order.queued_limit, stored.id, stored.expires_at)
            limiter = RateLimiter(b.redis, b.keys)
            self._hold = BatchHold(limiter, b.windows.measure, entry, order.settings)

    def run(self) -> None:
        try:
            self._run()
        except Exception:  # the batch must end: its reader would wait for the lease otherwise
            log.exception("the intake of batch %s failed", self._stored.id)
            message = "The server had an error while reading the input; create the batch again."
            self._fail([BatchError(code="server_error", message=message)])

    def _run(self) -> None:
        order = self._order
        models = LineModels(self._is_served, lambda model: self._roster.kinds([model])[model])
        messages = not order.file_id
        max_lines = order.settings.batch_max_lines
        intake = Intake(self._stored, order.owner, order.cache_scope, models, messages, max_lines)
        for number, raw in self._input(intake):
            intake.take(number, raw)
            if intake.requests > max_lines or len(intake.errors) >= MAX_ERRORS:
                break
            if len(intake.chunk.custom_ids) >= CHUNK_LINES and not intake.errors:
                if not self._queue(intake):
                    return
            elif number % CHUNK_LINES == 0:
                self._lines.renew(self._stored.id, time.time() + LEASE_S)
        intake.end()
        if intake.errors:
            self._fail(intake.errors)
        elif self._queue(intake):
            self._lines.close_intake(self._stored.id)

    def _input(self, intake: Intake) -> Iterator[tuple[int, bytes | str]]:
        """The input's lines, numbered from 1: the file's as they are read, or a message
        batch's requests as the Batch API's JSONL lines."""
        redis, keys = self._broker.redis, self._keys
        if self._order.file_id:
            settings = self._order.settings
            files = FileStore.of(redis, keys, settings, Quotas(redis, keys, settings))
            size = files.get(self._order.owner, self._order.file_id).bytes
            if size > MAX_INPUT_BYTES:
                intake.fail(
                    "too_large",
                    None,
                    f"The input file has {size} bytes; a batch's holds at most {MAX_INPUT_BYTES}.",
                )
                return
            lines = files.lines(self._order.owner, self._order.file_id)
            yield from enumerate(lines, start=1)
            return
        assert self._requests is not None  # parsed first (`parse_requests`)
        for number, line in enumerate(self._requests.lines(), start=1):
            yield number, json.dumps(line)

    def _is_served(self, model: str) -> bool:
        try:
            self._roster.require_model(model)
        except ModelNotFoundError:
            return False
        return True

    def _queue(self, intake: Intake) -> bool:
        """Record and queue what passed since the last chunk; False once the batch stopped."""
        chunk, stored = intake.cut(), self._stored
        named = sorted(intake.named)
        changed = named != stored.models
        stored.models = named
        jobs = chunk.jobs
        if self._hold is not None and jobs:
            try:
                jobs = self._hold.take(jobs)
            except RateLimitError as over:  # as OpenAI: the batch fails
                self._fail([BatchError(code="token_limit_exceeded", message=over.message)])
                return False
        self._lines.renew(stored.id, time.time() + LEASE_S)
        recorded = self._lines.record_chunk(
            stored, chunk.custom_ids, chunk.refused, int(time.time()), changed
        )
        if recorded:
            retries = self._order.settings.batch_line_retries
            self._broker.submit_bulk(jobs, retries=retries)
        if recorded and self._lines.running(stored.id):
            return True
        self._name_all()  # it stopped meanwhile (a cancel): each request ends `canceled`
        self._lines.stopped(stored, self._order.owner)
        return False

    def _fail(self, errors: list[BatchError]) -> None:
        self._name_all()  # each request is answered with the batch's error
        self._lines.fail(self._stored, self._order.owner, errors, int(time.time()))

    def _name_all(self) -> None:
        """A message batch's results list every request: its lines are all of them, whether
        its intake reached them or not (a Batch API file's are the lines read)."""
        if self._requests is not None:
            self._lines.name_all(self._stored.id, [r.custom_id for r in self._requests.requests])

    def parse_requests(self, body: bytes) -> bool:
        """Parse a message batch's request body as its route would, and tell the waiting
        request on stdout (`verdict`); False if it is not a message batch."""
        detail: ErrorDetail | None = None
        try:
            self._requests = parse_json(MessageBatchCreate, body)
        except ValidationError as err:
            detail = validation_detail(err)
        except MLXQError as err:
            detail = err.detail()
        sys.stdout.buffer.write(_PARSED if detail is None else detail.model_dump_json().encode())
        sys.stdout.buffer.write(b"\n")
        sys.stdout.close()
        return detail is None


def main() -> None:
    order = read_order(IntakeOrder)
    configure(order.settings)
    feed = Feed(order)
    if order.requests is None or feed.parse_requests(order.requests):
        feed.run()
