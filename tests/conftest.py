"""Fixtures on real parts: a private redis-server, a real worker on the real default model,
the API under gunicorn, and the OpenAI SDK pointed at it, all started by the harness that
`mlxq run` and the benchmarks use (worker/ops/cluster.py).

The stack is started once per test session on free ports, under the namespace `mlxqtest`; the
Redis at 127.0.0.1:6379 that a machine may run is never touched. A test of the in-process app
(`app`, `http`) gets a namespace of its own, flushed before and after it.

What is tested does not depend on the caller's shell: mlxq's settings (MLXQ_*, REDIS_URL) and
tracing (OTEL_*) are taken out of the environment before anything starts, so the in-process
apps and every process the harness spawns run on the defaults and on what a test sets, and the
end-to-end processes run the real engine. Only where the machine keeps its models, and how fast
its BLAS runs, pass through (`KEPT`). The header of the run names what was taken out. The prefix
cache's disk tier is off (`OFF`) unless a test turns it on in a folder of its own: what an
earlier run, or an earlier module's worker, left on disk must not change what a test sees.

A skip must be rare and named: a skip fails the test unless its reason is one of `ALLOWED_SKIPS`
(something a machine may lack, never something the code does); `-ra` prints each skip's reason
in the summary.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
from collections.abc import Generator, Iterator
from pathlib import Path

import hypothesis
import openai
import pytest
from flask import Flask
from flask.testing import FlaskClient
from redis import Redis

from api import create_app
from shared.queue.config import Settings
from tests import OPENBLAS
from tests.ordering import longest_first, measured
from tests.support import MODEL, NEEDS_NETNS, REAL_ENGINE, flush_namespace
from worker.ops.cluster import Cluster

NAMESPACE = "mlxqtest"
HEARTBEAT_S = 0.5
# Where the machine keeps its models and the GGUF, and how its BLAS runs: locations and speed,
# not behaviour.
KEPT = {"MLXQ_MODELS_DIR", "MLXQ_DEFAULT_GGUF", "MLXQ_OPENBLAS", "MLXQ_BLAS_THREADS"}
# The skips a run may have, by the start of their reason: what a machine may lack. NEEDS_NETNS is
# given only where the kernel refuses a network namespace, with its errno
# (tests/support.py `add_network_namespace`).
ALLOWED_SKIPS = (NEEDS_NETNS,)
OFF = {"MLXQ_PREFIX_CACHE_DISK_MB": "0"}
_taken_out: list[str] = []


def _changes_what_is_tested(name: str) -> bool:
    mlxq = name.startswith("MLXQ_") or name == "REDIS_URL"
    return (mlxq and name not in KEPT) or name.startswith("OTEL_")


# Property tests run the same examples on every run (`derandomize`: each test's seed comes from
# its own name), so a failure on CI fails again here; and a failure prints the blob that
# replays it (`@reproduce_failure`). HYPOTHESIS_PROFILE=explore turns the randomness back on.
hypothesis.settings.register_profile("ci", derandomize=True, print_blob=True)
hypothesis.settings.register_profile("explore", print_blob=True)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    for name in sorted(os.environ):
        if _changes_what_is_tested(name):
            del os.environ[name]
            _taken_out.append(name)
    os.environ.update(OFF)


def pytest_report_header(config: pytest.Config) -> str:
    names = ", ".join(_taken_out) or "none"
    blas = OPENBLAS or "MLX's reference BLAS"
    return f"mlxq settings taken out of the environment: {names}\nin-process BLAS: {blas}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (tests/ordering.py), and a node id of its own for each of
    Schemathesis's items: it names each API operation's item (`test[POST /v1/completions]`) but
    gives them all its test function's node id. pytest-xdist hands out tests by node id, so
    without this every operation but one would silently not run under `-n`."""
    for item in items:
        node = item._id  # pytest 9's NodeId: the path and the names under it
        if node.names and item.name.startswith(f"{node.names[-1]}[") and node.params is None:
            item._id = dataclasses.replace(node, names=(*node.names[:-1], item.name))
    items[:] = longest_first(items, measured())


def _refuse_unless_allowed(report: pytest.TestReport | pytest.CollectReport) -> None:
    """A skip that is not allowed (module docstring) is reported as a failure, with its reason."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    if not reason.startswith(ALLOWED_SKIPS):
        report.outcome = "failed"
        report.longrepr = f"a skip the test command does not allow: {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _refuse_unless_allowed(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """A whole module skipped (`importorskip`, `allow_module_level`) is held to the same rule."""
    report = yield
    _refuse_unless_allowed(report)
    return report


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The session's cluster: Redis now; the worker and the API when a test first asks."""
    logs = tmp_path_factory.mktemp("logs")
    cluster = Cluster(
        namespace=NAMESPACE, heartbeat_s=HEARTBEAT_S, model=MODEL, env=REAL_ENGINE, logs=logs
    )
    cluster.start_redis()
    yield cluster
    cluster.stop(quick=True)


@pytest.fixture(scope="session")
def redis_url(stack: Cluster) -> str:
    return stack.redis_url


@pytest.fixture(scope="session")
def settings(stack: Cluster) -> Settings:
    return Settings(
        redis_url=stack.redis_url, namespace=NAMESPACE, heartbeat_s=HEARTBEAT_S, model=MODEL
    )


@pytest.fixture(scope="session")
def redis(stack: Cluster) -> Redis:
    return stack.redis()


@pytest.fixture(scope="session")
def logs(stack: Cluster) -> Path:
    """Where the session's worker and API write their output (worker.log, api.log)."""
    assert stack.logs is not None
    return stack.logs


@pytest.fixture(scope="session")
def worker_process(stack: Cluster) -> subprocess.Popen[bytes]:
    return stack.start_worker(MLXQ_BATCH_SIZE="8").proc


@pytest.fixture(scope="session")
def api_url(stack: Cluster) -> str:
    return stack.start_api()


@pytest.fixture(scope="session")
def client(api_url: str, worker_process: subprocess.Popen[bytes]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def app_settings(
    settings: Settings, redis: Redis, request: pytest.FixtureRequest
) -> Iterator[Settings]:
    """The session's settings under a namespace of this test's own, empty before and after."""
    namespace = "t" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12]
    flush_namespace(redis, namespace)
    yield settings.model_copy(update={"namespace": namespace})
    flush_namespace(redis, namespace)


@pytest.fixture
def app(app_settings: Settings) -> Flask:
    return create_app(app_settings)


@pytest.fixture
def http(app: Flask) -> FlaskClient:
    return app.test_client()
