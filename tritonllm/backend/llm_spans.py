"""The llm's spans of a traced request: under the span Triton gave the request (its context from
`request.trace().get_context()`), one span for the sequence with three children, queue (arrival to first
scheduling), prefill (to the first token; the prompt's tokens and those from the prefix cache) and decode (to the
last token; the tokens and the finish reason), made when the sequence finishes from the times it kept. Attribute
names are OpenTelemetry's GenAI conventions' where they have one."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from tritonllm.common import tracing
from tritonllm.engine.state.sequence import FinishReason, Sequence

log = logging.getLogger(__name__)
SERVICE = "tritonllm-llm"


def on_finished(count: Callable[[FinishReason], None], request) -> Callable[[Sequence], None]:
    """What hears of each finished sample of `request` (a Triton request): `count` (the metrics), and where the
    request is traced, its spans."""
    carrier = _carrier(request) if tracing.tracer(SERVICE) is not None else None
    if carrier is None:
        return lambda seq: count(seq.finish_reason)

    def finished(seq: Sequence) -> None:
        count(seq.finish_reason)
        try:
            emit(carrier, seq)
        except Exception:  # a span is worth less than the answer: logged, never raised into the engine thread
            log.exception("spans of request %s not exported", seq.request_id)

    return finished


def _carrier(request) -> dict[str, str] | None:
    """The context the request's spans go under: Triton's (a JSON object holding `traceparent`, or the bare
    header), unless the request's own `traceparent` parameter (the shim's) names another trace. Triton 2.51 reads
    gRPC metadata values as C strings (`GrpcServerCarrier::Get` returns `it->second.data()`, which is not
    NUL-terminated), so a `traceparent` followed by other bytes in its buffer fails W3C's 55-character check and
    Triton starts a trace of its own: then the llm's spans go under the shim's span, past Triton's."""
    sent = _sent_traceparent(request)
    triton = _triton_context(request)
    if sent is None or (triton is not None and _trace_id(triton.get(tracing.TRACEPARENT)) == _trace_id(sent)):
        return triton
    return {tracing.TRACEPARENT: sent}


def _triton_context(request) -> dict[str, str] | None:
    try:
        context = request.trace().get_context()
    except Exception:
        return None
    if not context:
        return None
    if context.lstrip().startswith("{"):
        found = json.loads(context)
        return {k: v for k, v in found.items() if isinstance(v, str)} if isinstance(found, dict) else None
    return {tracing.TRACEPARENT: context.strip()}


def _sent_traceparent(request) -> str | None:
    try:
        parameters = json.loads(request.parameters() or "{}")
    except Exception:
        return None
    sent = parameters.get(tracing.TRACEPARENT) if isinstance(parameters, dict) else None
    return sent if isinstance(sent, str) else None


def _trace_id(traceparent: str | None) -> str | None:
    """The trace id of a W3C `traceparent` (version-traceid-spanid-flags)."""
    parts = (traceparent or "").split("-")
    return parts[1] if len(parts) == 4 else None


def emit(carrier: dict[str, str], seq: Sequence) -> None:
    from opentelemetry import trace  # noqa: PLC0415 - only a traced request gets here

    tracer = tracing.tracer(SERVICE)
    timing = seq.timing
    now_ns, now = time.time_ns(), time.monotonic()

    def wall(t: float | None) -> int:
        return now_ns - int((now - (now if t is None else t)) * 1e9)

    arrival, scheduled = wall(timing.arrival_time), wall(timing.first_scheduled_time)
    first, last = wall(timing.first_token_time or timing.first_scheduled_time), wall(timing.last_token_time)
    params = seq.params
    request = tracer.start_span(
        "llm generate",
        context=tracing.context_of(carrier),
        start_time=arrival,
        attributes={
            "gen_ai.operation.name": "text_completion",
            "gen_ai.request.max_tokens": params.max_tokens,
            "gen_ai.request.temperature": params.temperature,
            "gen_ai.usage.input_tokens": seq.num_prompt_tokens,
            "gen_ai.usage.output_tokens": seq.num_output_tokens,
            "gen_ai.response.finish_reasons": [seq.finish_reason.value if seq.finish_reason else ""],
            "tritonllm.request_id": seq.request_id,
            "tritonllm.priority": seq.priority,
        },
    )
    within = trace.set_span_in_context(request)
    phases = [
        ("queue", arrival, scheduled, {}),
        ("prefill", scheduled, first, {"gen_ai.usage.input_tokens": seq.num_prompt_tokens}),
        ("decode", first, last, {"gen_ai.usage.output_tokens": seq.num_output_tokens}),
    ]
    phases[1][3]["gen_ai.usage.cache_read.input_tokens"] = seq.counts.cached_tokens
    for name, start, end, attributes in phases:
        tracer.start_span(name, context=within, start_time=start, attributes=attributes).end(end_time=max(start, end))
    request.end(end_time=max(arrival, last))
