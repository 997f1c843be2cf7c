"""Redis as a real fleet runs it: reached over TLS (`rediss://`, a certificate made here by the
test's own CA) as an ACL user with a password, the default user switched off. The API and a
worker given only that URL serve a streamed request; an API given the URL without the password,
or without TLS, answers 503 in OpenAI's error shape, and its answers never repeat the
password."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from api import create_app
from shared.queue.config import Settings
from tests.e2e.faults.conftest import HEARTBEAT_S
from tests.support import CHAT, Stream, assert_openai_error, chat_body
from worker.ops.cluster import Cluster, free_port

USER, PASSWORD = "mlxq", "s3cret-for-the-test"


def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate for 127.0.0.1 that it signed (openssl's CLI)."""
    ca_key, ca, key, csr, cert, san = (
        folder / n for n in ("ca.key", "ca.crt", "s.key", "s.csr", "s.crt", "san.ext")
    )
    san.write_text("subjectAltName=IP:127.0.0.1\n")
    steps = [
        f"req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=ca -keyout {ca_key} -out {ca}",
        f"req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout {key} -out {csr}",
        f"x509 -req -in {csr} -CA {ca} -CAkey {ca_key} -CAcreateserial -days 1 -extfile {san}"
        f" -out {cert}",
    ]
    for step in steps:
        subprocess.run(["openssl", *step.split()], check=True, capture_output=True)
    return ca, cert, key


@pytest.fixture(scope="module")
def cluster(
    start_cluster: Callable[..., Cluster], tmp_path_factory: pytest.TempPathFactory
) -> Cluster:
    ca, cert, key = _certificates(tmp_path_factory.mktemp("tls"))
    port = free_port()
    tls = f"--port 0 --tls-port {port} --tls-cert-file {cert} --tls-key-file {key}"
    tls += f" --tls-ca-cert-file {ca} --tls-auth-clients no"
    users = f"--user default off --user {USER} on >{PASSWORD} ~* &* +@all"
    redis_args = [*tls.split(), *users.split()]
    url = f"rediss://{USER}:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={ca}"
    return start_cluster(redis={"port": port, "redis_args": redis_args, "url": url})


def test_the_api_and_a_worker_serve_over_tls_as_an_acl_user(cluster: Cluster) -> None:
    stream = Stream(cluster.api_url, chat_body(max_tokens=6))
    frames = stream.rest()
    assert stream.status == 200 and frames[-1] == "[DONE]" and len(frames) > 3


@pytest.mark.parametrize("missing", ["password", "tls"])
def test_an_api_given_the_url_without_the_password_or_tls_answers_503_naming_no_secret(
    cluster: Cluster, missing: str
) -> None:
    if missing == "password":
        url = cluster.redis_url.replace(f"{USER}:{PASSWORD}@", "")
    else:
        url = f"redis://{USER}:{PASSWORD}@127.0.0.1:{cluster.port}/0"
    settings = Settings(redis_url=url, namespace=cluster.namespace, heartbeat_s=HEARTBEAT_S)
    http = create_app(settings).test_client()
    for reply in (http.get("/health"), http.post(CHAT, json=chat_body(max_tokens=2))):
        assert_openai_error(reply, 503)
        assert reply.get_json()["error"]["code"] == "backend_unavailable"
        assert PASSWORD not in reply.get_data(as_text=True)
