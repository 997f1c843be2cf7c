"""A worker on another host, across a real network boundary: its own network namespace (and host
name), joined to the test's Redis by a veth pair whose two addresses the test gives itself
(10.213.0.1 on this side, 10.213.0.2 in the namespace). Redis listens on loopback and on the
veth address, with a password, as a fleet's Redis would. The worker is given only REDIS_URL and
its model, so the API and the loopback worker run with the default namespace and heartbeat.

It serves requests and the fleet view lists it with its host; a rolling restart (a new worker
started, the old one told to stop and drain) loses no request; when its link goes down it drops
out within the heartbeat window, its stream ends with an error frame, and its bulk job runs
again on the loopback worker and finishes exactly once; when the link comes back the worker
finds its tombstone and exits rather than finish the job a second time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from shared.queue.liveness import LIVE_FACTOR
from shared.wire.events import DoneEvent, RequeuedEvent, decode_event
from tests.e2e.faults.conftest import holder, started_ids
from tests.support import CHAT, MODEL, Stream, add_network_namespace, chat_body, rq_job
from worker.ops.cluster import ROOT, Cluster, Worker, free_port, wait_until
from worker.runtime.serve import EXIT_BURIED

HOST_IP, REMOTE_IP = "10.213.0.1", "10.213.0.2"
REMOTE_HOST = "mlxq-remote"
PASSWORD = "fleet-password-for-the-test"
HEARTBEAT_S = 2.0  # the default: the remote worker is told nothing else


@dataclass(frozen=True)
class Link:
    namespace: str
    host_side: str

    def ip(self, *args: str, inside: bool = False) -> None:
        prefix = ["ip", "netns", "exec", self.namespace] if inside else []
        subprocess.run([*prefix, "ip", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def link() -> Iterator[Link]:
    tag = f"mq{os.getpid() % 100000}"
    link = Link(f"{tag}ns", f"{tag}h")
    add_network_namespace(link.namespace)  # skips only where the kernel refuses
    try:
        inside = f"{tag}n"
        link.ip("link", "add", link.host_side, "type", "veth", "peer", "name", inside)
        link.ip("link", "set", inside, "netns", link.namespace)
        link.ip("addr", "add", f"{HOST_IP}/30", "dev", link.host_side)
        link.ip("link", "set", link.host_side, "up")
        link.ip("addr", "add", f"{REMOTE_IP}/30", "dev", inside, inside=True)
        link.ip("link", "set", inside, "up", inside=True)
        link.ip("link", "set", "lo", "up", inside=True)
        yield link
    finally:
        subprocess.run(["ip", "netns", "del", link.namespace], capture_output=True)
        subprocess.run(["ip", "link", "del", link.host_side], capture_output=True)


@pytest.fixture(scope="module")
def cluster(start_cluster: Callable[..., Cluster], link: Link) -> Cluster:
    port = free_port()
    redis = {
        "port": port,
        "redis_args": ["--bind", f"127.0.0.1 {HOST_IP}", "--requirepass", PASSWORD],
        "url": f"redis://:{PASSWORD}@127.0.0.1:{port}/0",
    }
    return start_cluster(workers=0, heartbeat_s=HEARTBEAT_S, redis=redis, namespace="mlxq")


def start_remote(cluster: Cluster, link: Link) -> Worker:
    """The worker in the namespace, under its own host name, knowing only REDIS_URL and its
    model. `ip netns exec`, `unshare` and `sh` each exec the next, so its pid is the Popen's."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        "REDIS_URL": f"redis://:{PASSWORD}@{HOST_IP}:{cluster.port}/0",
        "MLXQ_MODEL": MODEL,
    }
    run = f"hostname {REMOTE_HOST} && exec {sys.executable} -m worker.ops.cli worker"
    args = ["ip", "netns", "exec", link.namespace, "unshare", "--uts", "sh", "-c", run]
    assert cluster.logs is not None
    with (cluster.logs / "remote.log").open("ab") as out:
        proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    worker = Worker(proc, f"{REMOTE_HOST}.{proc.pid}")
    cluster.workers.append(worker)
    cluster.wait_for_worker(worker)
    return worker


def fleet_workers(cluster: Cluster) -> dict[str, str]:
    """Live worker id -> host, as the fleet view shows them."""
    fleet = httpx.get(f"{cluster.api_url}/v1/fleet", timeout=10).json()
    return {w["worker_id"]: w["host"] for w in fleet["workers"]}


def test_a_worker_in_its_own_namespace_serves_and_is_listed_with_its_host(
    cluster: Cluster, link: Link
) -> None:
    remote = start_remote(cluster, link)
    assert fleet_workers(cluster) == {remote.worker_id: REMOTE_HOST}
    models = httpx.get(f"{cluster.api_url}/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in models] == [MODEL]
    stream = Stream(cluster.api_url, chat_body(max_tokens=8))
    stream.read_tokens(1)
    assert stream.rest()[-1] == "[DONE]"


def test_a_rolling_restart_of_the_remote_worker_loses_no_request(
    cluster: Cluster, link: Link
) -> None:
    (old,) = [w for w in cluster.workers if w.worker_id.startswith(REMOTE_HOST)]
    new = start_remote(cluster, link)
    stop = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        load = pool.submit(_requests_until, cluster, stop)
        try:  # a failure here must still stop the load, or the pool waits for it for good
            wait_until(lambda: started_ids(cluster), 60, "the load to run")
            old.proc.send_signal(signal.SIGTERM)  # it drains its jobs, then exits
            status = old.proc.wait(timeout=90)
            assert status == 0, f"the drained worker exited with {status}:\n{_log_tail(cluster)}"
            time.sleep(1)
        finally:
            stop.set()
            if old.proc.poll() is not None:  # the next test finds one remote worker either way
                cluster.workers.remove(old)
        statuses = load.result(timeout=120)
    assert statuses and set(statuses) == {200}, statuses
    assert fleet_workers(cluster) == {new.worker_id: REMOTE_HOST}


def _log_tail(cluster: Cluster, lines: int = 40) -> str:
    assert cluster.logs is not None
    return "\n".join((cluster.logs / "remote.log").read_text().splitlines()[-lines:])


def _requests_until(cluster: Cluster, stop: threading.Event) -> list[int]:
    statuses = []
    while not stop.is_set():
        reply = httpx.post(f"{cluster.api_url}{CHAT}", json=chat_body(max_tokens=6), timeout=60)
        statuses.append(reply.status_code)
    return statuses


# Its waits add up to more than the suite's 300 s (the bulk job alone may take 300 s again on a
# busy machine), so it has a timeout of its own.
@pytest.mark.timeout(900)
def test_when_its_link_goes_down_it_drops_out_and_loses_nothing(
    cluster: Cluster, link: Link
) -> None:
    (remote,) = [w for w in cluster.workers if w.worker_id.startswith(REMOTE_HOST)]
    stream = Stream(cluster.api_url, chat_body(max_tokens=2000))
    stream.read_tokens(2)
    long_story = {"model": MODEL, "input": "Tell a very long story.", "temperature": 0}
    # Long enough to be still running when the link goes down a moment after it started (an
    # end token or its last token before that would fail the RequeuedEvent check below), and
    # no longer: the loopback worker runs it again from its start.
    background = httpx.post(
        f"{cluster.api_url}/v1/responses",
        json={**long_story, "background": True, "max_output_tokens": 80},
        timeout=30,
    ).json()
    redis = cluster.redis()
    wait_until(lambda: rq_job(redis, background["id"]).get_status() == "started", 60, "bulk")
    assert holder(cluster, background["id"]) is remote
    # A live worker to hand the bulk job to, loading its model while the remote one drops out
    # (started only now, so that the bulk job could not have gone to it).
    local = cluster.start_worker(wait=False)

    link.ip("link", "set", link.host_side, "down")
    down = time.monotonic()
    window = LIVE_FACTOR * HEARTBEAT_S + 2  # the heartbeat window, and the watch's poll
    wait_until(lambda: remote.worker_id not in fleet_workers(cluster), window, "the drop-out")
    error = stream.rest()[-1]
    ended = time.monotonic()
    assert '"worker_lost"' in error and ended - down < window + 2
    cluster.wait_for_worker(local)

    def answered() -> bool:
        body = httpx.get(f"{cluster.api_url}/v1/responses/{background['id']}", timeout=10).json()
        return bool(body["status"] in ("completed", "incomplete"))

    wait_until(answered, 300, "the bulk job to finish on the loopback worker")
    done = time.monotonic()
    events = [decode_event(e) for e in redis.lrange(cluster.keys.replay(background["id"]), 0, -1)]
    assert events[0] == RequeuedEvent(attempt=2)
    assert sum(isinstance(e, DoneEvent) for e in events) == 1
    # RQ saves the job's result a moment after the answer is published and stored.
    job = rq_job(redis, background["id"])
    wait_until(lambda: len(job.results()) > 0, 30, "the bulk job's result")
    assert len(job.results()) == 1
    assert fleet_workers(cluster) == {local.worker_id: fleet_workers(cluster)[local.worker_id]}

    link.ip("link", "set", link.host_side, "up")
    back = time.monotonic()
    assert remote.proc.wait(timeout=120) == EXIT_BURIED  # it never finishes the job twice
    cluster.workers.remove(remote)
    assert len(rq_job(redis, background["id"]).results()) == 1
    print(f"link down at 0 s; dropped out and stream ended by {ended - down:.1f} s; bulk job")
    print(f"done by {done - down:.1f} s; the worker exited {time.monotonic() - back:.1f} s after")
    print(f"its link came back, with status {EXIT_BURIED} (buried)")
    os.kill(local.pid, signal.SIGTERM)
