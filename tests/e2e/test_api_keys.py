"""API keys and binding on the real stack: gunicorn with keys, the OpenAI SDK, the logs."""

from __future__ import annotations

import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from tests.support import MODEL
from worker.ops.cluster import API, Cluster, free_port, http_answers, spawn, stop, wait_until

KEYS = ("sk-mlxq-test-alpha-5b1d0c", "sk-mlxq-test-beta-77e2f9")


def start_api(stack: Cluster, log: Path, **env: str) -> subprocess.Popen[bytes]:
    return spawn(API, stack.environment(**env), log)


@pytest.fixture(scope="module")
def keyed_api(
    stack: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    port = free_port()
    log = tmp_path_factory.mktemp("keyed") / "gunicorn.log"
    proc = start_api(
        stack,
        log,
        MLXQ_API_BIND=f"127.0.0.1:{port}",
        MLXQ_API_KEYS=",".join(KEYS),
        MLXQ_API_ACCESS_LOG="true",
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_answers(f"{url}/health"), 30, "the keyed API")
    yield url, log
    stop(proc)


def test_the_sdk_works_with_a_key_and_gets_401_without(
    keyed_api: tuple[str, Path], client: openai.OpenAI
) -> None:
    url, _ = keyed_api
    keyed = openai.OpenAI(base_url=f"{url}/v1", api_key=KEYS[1], max_retries=0, timeout=60)
    reply = keyed.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=2)
    assert reply.choices[0].text
    wrong = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        wrong.models.list()
    assert caught.value.code == "invalid_api_key"
    with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
        assert response.status == 200  # public


def test_the_anthropic_sdk_authenticates_with_x_api_key(
    keyed_api: tuple[str, Path], worker_process: subprocess.Popen[bytes]
) -> None:
    url, _ = keyed_api
    ask: list[anthropic.types.MessageParam] = [{"role": "user", "content": "Hello"}]
    keyed = anthropic.Anthropic(base_url=url, api_key=KEYS[0], max_retries=0, timeout=60)
    reply = keyed.messages.create(model=MODEL, max_tokens=2, messages=ask)
    assert reply.usage.output_tokens == 2
    wrong = anthropic.Anthropic(base_url=url, api_key="sk-not-a-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        wrong.messages.create(model=MODEL, max_tokens=2, messages=ask)
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "Incorrect API key provided."},
    }


def test_keys_never_reach_the_logs(keyed_api: tuple[str, Path]) -> None:
    url, log = keyed_api
    for key in (*KEYS, "sk-a-wrong-key-3c9f"):
        request = urllib.request.Request(
            f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}
        )
        try:
            urllib.request.urlopen(request, timeout=5).close()
        except urllib.error.HTTPError as err:
            assert err.code == 401
    text = log.read_text()
    assert "/v1/models" in text  # the access log is on
    assert not any(key in text for key in (*KEYS, "sk-a-wrong-key-3c9f"))


def test_without_keys_an_open_bind_is_refused_at_start(stack: Cluster, tmp_path: Path) -> None:
    log = tmp_path / "open.log"
    proc = start_api(stack, log, MLXQ_API_BIND=f"0.0.0.0:{free_port()}", MLXQ_API_KEYS="")
    try:
        assert proc.wait(timeout=30) != 0
    finally:
        stop(proc)
    assert "refusing to listen on 0.0.0.0" in log.read_text()
    assert "Listening at" not in log.read_text()


def test_without_keys_the_api_says_it_binds_to_loopback(stack: Cluster, tmp_path: Path) -> None:
    log = tmp_path / "loopback.log"
    port = free_port()
    proc = start_api(stack, log, MLXQ_API_BIND=f"127.0.0.1:{port}", MLXQ_API_KEYS="")
    try:
        wait_until(lambda: http_answers(f"http://127.0.0.1:{port}/health"), 30, "the API")
    finally:
        stop(proc)
    assert "no API keys set (MLXQ_API_KEYS): listening on the loopback interface only" in (
        log.read_text()
    )
