"""One structured log line per request (API) and per job (worker), without the prompt or the
output, on the session's real API and worker (text format); the JSON format, and what the
formatters leave out (other extras, an exception's text), on their own.
tests/e2e/faults/test_prompt_free_logs.py makes a job raise on a real worker."""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from redis import Redis
from redis.exceptions import ResponseError

from shared.observe.logs import configure, log_event
from shared.queue.config import Settings
from tests.support import MODEL
from worker.ops.cluster import wait_until

SECRET = "zebra-marmalade-42"


def line_for(log: Path, message: str, job_id: str) -> str | None:
    for line in log.read_text(errors="replace").splitlines():
        if f" {message} " in line and f"job_id={job_id}" in line:
            return line
    return None


def test_a_request_and_its_job_each_log_one_line_with_the_figures_and_no_text(
    client: openai.OpenAI, logs: Path
) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"Repeat after me: {SECRET}"}],
        max_tokens=12,
        temperature=0,
    )
    api_log, worker_log = logs / "api.log", logs / "worker.log"
    wait_until(lambda: line_for(api_log, "request", reply.id), 5, "the request's line")
    wait_until(lambda: line_for(worker_log, "job", reply.id), 5, "the job's line")
    assert reply.usage is not None
    for line in (line_for(api_log, "request", reply.id), line_for(worker_log, "job", reply.id)):
        assert line is not None
        assert f"model={MODEL}" in line and "owner=anonymous" in line
        assert f"prompt_tokens={reply.usage.prompt_tokens}" in line
        assert f"completion_tokens={reply.usage.completion_tokens}" in line
        for field in ("cached_tokens=", "queue_s=", "ttft_s=", "duration_s=", "worker="):
            assert field in line
        assert f"finish_reason={reply.choices[0].finish_reason}" in line
    text = api_log.read_text(errors="replace") + worker_log.read_text(errors="replace")
    assert SECRET not in text
    assert (reply.choices[0].message.content or "")[:12] not in text


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    hooks = sys.excepthook, threading.excepthook
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    sys.excepthook, threading.excepthook = hooks


def test_the_json_format_writes_each_field_as_a_key(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(Settings(log_format="json", log_level="info"))
    log_event(logging.getLogger("mlxq.job"), "job", job_id="chatcmpl-1", ttft_s=0.25, owner=None)
    logging.getLogger("mlxq.quiet").debug("below the level")
    (line,) = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["message"] == "job" and record["level"] == "INFO"
    assert (record["job_id"], record["ttft_s"], record["owner"]) == ("chatcmpl-1", 0.25, None)


def _raise_over(text: str) -> None:
    raise ValueError(f"cannot read {text!r}")


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_only_a_structured_lines_fields_are_written_never_another_extra(
    restore_logging: None, capsys: pytest.CaptureFixture[str], log_format: str
) -> None:
    configure(Settings(log_format=log_format))
    # As RQ logs a failed job: its arguments (the whole payload) as extras.
    logging.getLogger("rq.worker").error("job failed", extra={"arguments": [SECRET]})
    log_event(logging.getLogger("mlxq.job"), "job", job_id="chatcmpl-2")
    failed, job = capsys.readouterr().err.splitlines()
    assert "job failed" in failed and SECRET not in failed and "arguments" not in failed
    assert "chatcmpl-2" in job


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_an_exception_is_logged_as_its_frames_and_type_without_its_text(
    restore_logging: None, capsys: pytest.CaptureFixture[str], log_format: str
) -> None:
    configure(Settings(log_format=log_format))
    try:
        try:
            _raise_over(SECRET)
        except ValueError as err:
            raise KeyError(SECRET) from err
    except KeyError:
        logging.getLogger("mlxq.test").exception("job failed")
    try:
        raise ConnectionRefusedError(111, "Connection refused")
    except OSError:
        logging.getLogger("mlxq.test").exception("no Redis")
    text = capsys.readouterr().err
    assert SECRET not in text
    for shown in ("_raise_over", "ValueError", "KeyError", "direct cause", "Connection refused"):
        assert shown in text


def test_an_exception_nothing_caught_in_a_thread_is_logged_without_its_text(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(Settings())
    thread = threading.Thread(target=_raise_over, args=(SECRET,), name="doomed")
    thread.start()
    thread.join()
    text = capsys.readouterr().err
    assert "uncaught exception in thread doomed" in text and "_raise_over" in text
    assert SECRET not in text


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_an_exception_given_as_a_messages_argument_is_written_as_its_type(
    restore_logging: None, capsys: pytest.CaptureFixture[str], log_format: str
) -> None:
    configure(Settings(log_format=log_format))
    logging.getLogger("mlxq.test").warning("could not read it: %s", ValueError(SECRET))
    line = capsys.readouterr().err
    assert "could not read it: ValueError" in line and SECRET not in line


def test_a_redis_pipeline_error_keeps_its_command_but_not_its_values(
    restore_logging: None,
    capsys: pytest.CaptureFixture[str],
    redis: Redis,
    app_settings: Settings,
) -> None:
    configure(Settings())
    key = f"{app_settings.namespace}:log-test"
    pipe = redis.pipeline(transaction=False)
    pipe.set(key, SECRET)
    pipe.hset(key, "text", SECRET)  # a hash command on a string: redis-py quotes the command
    with pytest.raises(ResponseError) as raised:
        pipe.execute()
    assert SECRET in str(raised.value)
    logging.getLogger("mlxq.test").warning("Redis failed: %s", raised.value)
    line = capsys.readouterr().err
    assert "Command # 2 (HSET ...) of pipeline caused error: WRONGTYPE" in line
    assert SECRET not in line
