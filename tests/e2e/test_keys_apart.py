"""Keys kept apart on the real stack. Cache scopes (shared/queue/prefix/cache_scope.py): one key's
prompts are invisible in another key's `cached_tokens`; keys an operator names together share a
cache; a request's `cache_salt` narrows its key's; /metrics, whose counters move with every
key's prompts, takes an operator's key. Open requests (api/limits/open_requests.py): a key at its
`:open=N` is refused until one of its requests ends.

An API with keys runs beside the session's worker; each test's keys are new to the worker's
cache, so whatever it holds for other tests' requests (made without keys) is no other scope's.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support import MODEL
from worker.ops.cluster import API, Cluster, free_port, http_answers, spawn, stop, wait_until

ALPHA, BETA, GAMMA = "sk-scope-alpha-1", "sk-scope-beta-2", "sk-scope-gamma-3"
TEAM = ("sk-scope-team-4", "sk-scope-team-5")  # named together: `:cache=team`
ADMIN = "sk-scope-admin-6"
ONE_AT_A_TIME = "sk-scope-open-7"  # `:open=1`


@pytest.fixture(scope="module")
def keyed_url(
    stack: Cluster,
    worker_process: subprocess.Popen[bytes],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    port = free_port()
    keys = [ALPHA, BETA, GAMMA, *(f"{key}:cache=team" for key in TEAM), f"{ONE_AT_A_TIME}:open=1"]
    env = stack.environment(
        MLXQ_API_BIND=f"127.0.0.1:{port}", MLXQ_API_KEYS=",".join(keys), MLXQ_ADMIN_KEYS=ADMIN
    )
    proc = spawn(API, env, tmp_path_factory.mktemp("scopes") / "gunicorn.log")
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_answers(f"{url}/health"), 30, "the keyed API")
    yield url
    stop(proc)


def _secret() -> str:
    """A system prompt of about a hundred tokens, never sent before, from its first words (so
    that the same key's other prompts share no more than the chat template's opening)."""
    code = "-".join(str(secrets.randbelow(10_000)) for _ in range(6))
    return f"{code} is the code of the vault you guard. " + "Never tell anyone the code. " * 12


def _cached(url: str, key: str, system: str, **extra: object) -> tuple[int, int]:
    """A chat turn under `system` as `key`: its prompt tokens, and how many were cached."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "Hi."}],
        max_tokens=2,
        temperature=0,
        extra_body=extra or None,
    )
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    return reply.usage.prompt_tokens, reply.usage.prompt_tokens_details.cached_tokens or 0


def test_another_keys_right_guess_of_a_prompt_is_told_what_a_wrong_guess_is(
    keyed_url: str,
) -> None:
    secret = _secret()
    _cached(keyed_url, ALPHA, secret)
    prompt_tokens, own = _cached(keyed_url, ALPHA, secret)  # the key's own repeat: cached
    right = _cached(keyed_url, BETA, secret)[1]
    wrong = _cached(keyed_url, GAMMA, _secret())[1]
    assert own >= prompt_tokens - 8
    assert right == wrong < prompt_tokens // 10


def test_keys_an_operator_names_together_share_one_cache(keyed_url: str) -> None:
    secret = _secret()
    _cached(keyed_url, TEAM[0], secret)
    prompt_tokens, shared = _cached(keyed_url, TEAM[1], secret)
    outside = _cached(keyed_url, ALPHA, secret)[1]
    assert shared >= prompt_tokens - 8
    assert outside < prompt_tokens // 10


def test_a_cache_salt_narrows_its_keys_cache_to_the_requests_giving_it(keyed_url: str) -> None:
    secret = _secret()
    _cached(keyed_url, ALPHA, secret, cache_salt="salt-one")
    prompt_tokens, salted = _cached(keyed_url, ALPHA, secret, cache_salt="salt-one")
    other_salt = _cached(keyed_url, ALPHA, secret, cache_salt="salt-two")[1]
    unsalted = _cached(keyed_url, ALPHA, secret)[1]
    assert salted >= prompt_tokens - 8
    assert other_salt < prompt_tokens // 10 and unsalted < prompt_tokens // 10


def test_metrics_take_an_operators_key(keyed_url: str) -> None:
    refused = httpx.get(f"{keyed_url}/metrics", headers={"Authorization": f"Bearer {ALPHA}"})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "permission_denied"
    allowed = httpx.get(f"{keyed_url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"})
    assert allowed.status_code == 200 and "mlxq:" in allowed.text


def test_a_key_at_its_open_requests_is_refused_until_one_ends(keyed_url: str) -> None:
    client = openai.OpenAI(
        base_url=f"{keyed_url}/v1", api_key=ONE_AT_A_TIME, max_retries=0, timeout=120
    )
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count to fifty."}]}
    stream = client.chat.completions.create(**body, max_tokens=40, stream=True)
    next(iter(stream))  # open: its first chunk has come
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(**body, max_tokens=2)
    assert refused.value.response.headers["Retry-After"]
    other = openai.OpenAI(base_url=f"{keyed_url}/v1", api_key=ALPHA, max_retries=0, timeout=120)
    assert other.chat.completions.create(**body, max_tokens=2).choices  # other keys go on
    for _ in stream:  # the stream ends: its place with it
        pass
    assert client.chat.completions.create(**body, max_tokens=2).choices
