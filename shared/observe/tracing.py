"""OpenTelemetry traces of a request across processes, on only when OTEL_EXPORTER_OTLP_ENDPOINT
is set (any OTLP/HTTP backend: a collector, Jaeger, Tempo, LogFire, ...).

One trace per request: the API's span for the request (from its arrival to its answer or the
end of its stream), and, as its children, the worker's spans for the job (`queue wait`, and
`generate` with `prefill` inside it, up to the first token). The API puts the W3C
`traceparent` of its span in the job (`GenerationJob.trace`); the worker builds its spans when
the job has ended, from the times it recorded anyway, so nothing of this runs per token.
Attribute names follow OpenTelemetry's GenAI semantic conventions (`gen_ai.*`).

Without the variable, `setup` installs nothing, `request_span` returns None and jobs carry no
trace (`traceparent`): no other code here runs.
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from shared.queue.jobs import EmbeddingJob, QueuedJob
from shared.wire.events import DoneEvent

SYSTEM = "mlxq"


def enabled() -> bool:
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def setup(service: str) -> None:
    """Export this process's spans over OTLP/HTTP, if enabled (call once, after any fork)."""
    if not enabled():
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


def _request_attributes(job: QueuedJob) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": job.operation,
        "gen_ai.system": SYSTEM,
        "gen_ai.request.model": job.model,
    }
    if isinstance(job, EmbeddingJob):
        return attributes
    attributes["gen_ai.request.temperature"] = job.sampling.temperature
    if job.max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = job.max_tokens
    return attributes


def request_span(job: QueuedJob) -> Span | None:
    """The API's span for a request; None when tracing is off."""
    if not enabled():
        return None
    name = f"{job.operation} {job.model}"
    return trace.get_tracer("mlxq.api").start_span(
        name, kind=SpanKind.SERVER, attributes=_request_attributes(job)
    )


def traceparent(span: Span | None) -> str | None:
    """The span's context as the job carries it to its worker (`QueuedJobBase.trace`)."""
    if span is None:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


def end_request(
    span: Span | None,
    response_id: str,
    prompt_tokens: int,
    done: DoneEvent | None,
    error_code: str | None,
) -> None:
    """End the API's span with what the request came to: its job's final event, if it had one."""
    if span is None:
        return
    span.set_attribute("gen_ai.response.id", response_id)
    span.set_attribute("gen_ai.usage.input_tokens", prompt_tokens)
    if done is not None:
        span.set_attribute("gen_ai.usage.output_tokens", done.usage.completion_tokens)
        span.set_attribute("gen_ai.response.finish_reasons", [done.finish_reason])
    if error_code is not None:
        span.set_status(Status(StatusCode.ERROR, error_code))
    span.end()


def job_spans(
    job: QueuedJob,
    times: tuple[float, float, float | None, float],
    usage: tuple[int, int],
    finish_reason: str,
) -> None:
    """The worker's spans for an ended job, children of the request's span. `times`: unix s of
    enqueue, start, first token (None: none came) and end."""
    if job.trace is None or not enabled():
        return
    enqueued, started, first, ended = (None if t is None else int(t * 1e9) for t in times)
    assert enqueued is not None and started is not None and ended is not None
    parent = propagate.extract({"traceparent": job.trace})
    tracer = trace.get_tracer("mlxq.worker")
    tracer.start_span("queue wait", context=parent, start_time=enqueued).end(end_time=started)
    attributes = {
        **_request_attributes(job),
        "gen_ai.response.id": job.job_id,
        "gen_ai.usage.input_tokens": usage[0],
        "gen_ai.usage.output_tokens": usage[1],
        "gen_ai.response.finish_reasons": [finish_reason],
    }
    generate = tracer.start_span(
        f"generate {job.model}", context=parent, start_time=started, attributes=attributes
    )
    inside = trace.set_span_in_context(generate)
    tracer.start_span("prefill", context=inside, start_time=started).end(end_time=first or ended)
    generate.end(end_time=ended)
