"""Traces across processes (shared/observe/tracing.py): with OTEL_EXPORTER_OTLP_ENDPOINT set, one
request gives one connected trace, the API's span with the worker's spans as its children, under
OpenTelemetry's GenAI attribute names. The spans go to an OTLP/HTTP collector this test runs
itself on a free loopback port. Without the variable a job carries no trace."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from shared.queue.jobs import job_for
from shared.wire.chat.completions import ChatCompletionRequest
from tests.support import CHAT, MODEL
from worker.ops.cluster import Cluster, free_port, wait_until

Spans = list[dict[str, Any]]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@pytest.fixture(scope="module")
def collector() -> Iterator[tuple[str, Spans]]:
    spans: Spans = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                service = {a.key: _value(a.value) for a in resource.resource.attributes}
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        spans.append(
                            {
                                "service": service.get("service.name"),
                                "name": span.name,
                                "trace": span.trace_id.hex(),
                                "id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                                "attributes": {a.key: _value(a.value) for a in span.attributes},
                            }
                        )
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", spans
    server.shutdown()
    server.server_close()  # shutdown only stops serving: the listening socket is closed here


@pytest.fixture(scope="module")
def cluster(start_cluster: Callable[..., Cluster], collector: tuple[str, Spans]) -> Cluster:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector[0], "OTEL_BSP_SCHEDULE_DELAY": "100"}
    return start_cluster(env=env)


def test_one_request_gives_one_connected_trace(
    cluster: Cluster, collector: tuple[str, Spans]
) -> None:
    _, spans = collector
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
    reply = httpx.post(f"{cluster.api_url}{CHAT}", json=body, timeout=60).json()

    def of(name: str) -> list[dict[str, Any]]:
        return [
            s
            for s in spans
            if s["name"] == name
            and s["attributes"].get("gen_ai.response.id", reply["id"]) == reply["id"]
        ]

    names = ("queue wait", "prefill", f"chat {MODEL}", f"generate {MODEL}")
    wait_until(lambda: all(of(n) for n in names), 20, "the spans")
    (request,) = of(f"chat {MODEL}")
    (generate,) = of(f"generate {MODEL}")
    queue_waits = [s for s in of("queue wait") if s["parent"] == request["id"]]
    prefills = [s for s in of("prefill") if s["parent"] == generate["id"]]
    assert request["service"] == "mlxq-api" and generate["service"] == "mlxq-worker"
    assert generate["parent"] == request["id"] and len(queue_waits) == len(prefills) == 1
    assert {s["trace"] for s in (request, generate, *queue_waits, *prefills)} == {request["trace"]}
    usage = reply["usage"]
    for span in (request, generate):
        attributes = span["attributes"]
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.request.model"] == MODEL
        assert attributes["gen_ai.request.max_tokens"] == 5
        assert attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
        assert attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
        assert attributes["gen_ai.response.finish_reasons"] == [
            reply["choices"][0]["finish_reason"]
        ]


def test_without_the_variable_a_job_carries_no_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.observe import tracing

    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    request = ChatCompletionRequest(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
    job = job_for("chatcmpl-1", request)
    assert tracing.request_span(job) is None and job.trace is None
