"""Traces from the client to the engine: `serve --otlp-traces-endpoint` at an OTLP/HTTP receiver in the test, which
decodes what arrives (the SDK's protobuf with opentelemetry-proto, Triton's JSON as OTLP/JSON). One client request
with a `traceparent` gives one trace: the shim's span under the client's, Triton's spans under the shim's, the llm's
under Triton's span of the llm model, with queue, prefill and decode under it."""

from __future__ import annotations

import http.server
import json
import threading

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from triton_helpers import wait_for

from tritonllm.launcher.tritonserver import free_port

from .conftest import running_serve

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


class Receiver:
    """An OTLP/HTTP endpoint: every span it was sent, as (service, name, trace id, span id, parent id, attributes)."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.errors: list[str] = []  # exports it could not read
        received, errors = self.spans, self.errors

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # the exporters keep their connections open

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    received.extend(_spans(body, self.headers.get("Content-Type", "")))
                except Exception as e:
                    errors.append(f"{self.headers.get('Content-Type')}, {len(body)} bytes: {e!r}")
                self.send_response(200)
                self.send_header("Content-Type", self.headers.get("Content-Type", "application/x-protobuf"))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"


def _spans(body: bytes, content_type: str) -> list[dict]:
    found = []
    if "json" in content_type:  # OTLP/JSON: ids in hex
        for resource in json.loads(body)["resourceSpans"]:
            service = _service(resource["resource"].get("attributes", []), lambda a: a["value"].get("stringValue"))
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    ids = (span["traceId"], span["spanId"], span.get("parentSpanId", ""))
                    attributes = {a["key"]: a["value"] for a in span.get("attributes", [])}
                    found.append(_span(service, span["name"], *ids, attributes))
        return found
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    for resource in request.resource_spans:
        service = _service(resource.resource.attributes, lambda a: a.value.string_value)
        for scope in resource.scope_spans:
            for span in scope.spans:
                ids = (span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex())
                found.append(_span(service, span.name, *ids, {a.key: a.value for a in span.attributes}))
    return found


def _service(attributes, value) -> str:
    return next((value(a) for a in attributes if (a["key"] if isinstance(a, dict) else a.key) == "service.name"), "")


def _span(service: str, name: str, trace: str, span: str, parent: str, attributes: dict) -> dict:
    return {"service": service, "name": name, "trace": trace, "span": span, "parent": parent, "attributes": attributes}


@pytest.fixture(scope="module")
def traced(tiny_model_dir, tmp_path_factory):
    receiver = Receiver()
    flags = ("--no-embedding", "--otlp-traces-endpoint", receiver.url)
    log_dir = tmp_path_factory.mktemp("traced")
    with running_serve(tiny_model_dir, log_dir, *flags) as ports:
        yield receiver, f"http://127.0.0.1:{ports['--shim-port']}", log_dir / "serve.log"
    receiver.server.shutdown()


def test_one_request_is_one_trace_from_the_client_to_the_engine(traced):
    """Triton 2.51 at times drops the client's trace from a gRPC call's metadata (it reads the value as a C string,
    past its end; backend/llm_spans.py) and traces the call in a trace of its own: then the llm's spans go under the
    shim's span, and Triton's span of that call lies in its own trace. Either way the llm's spans are the client's."""
    receiver, shim, log = traced
    headers = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
    body = {"model": "tiny", "prompt": "Hello there", "max_tokens": 5, "ignore_eos": True}
    assert httpx.post(f"{shim}/v1/completions", json=body, headers=headers, timeout=60).status_code == 200

    def ours() -> list[dict]:
        return [s for s in receiver.spans if s["trace"] == TRACE_ID]

    def spans_named(name: str) -> list[dict]:
        return [s for s in ours() if s["name"] == name]

    def tritons_llm_span() -> list[dict]:  # Triton's span of the llm model for the generation, in whichever trace
        generated = [_text(s["attributes"]["tritonllm.request_id"]) for s in spans_named("llm generate")]
        return [
            s
            for s in receiver.spans
            if s["service"] == "tritonserver" and s["name"] == "llm"
            and _text(s["attributes"].get("triton.request_id")) in generated
        ]  # fmt: skip

    def arrived() -> bool:  # each exporter sends on its own schedule (Triton's every few seconds)
        names = [s["name"] for s in ours()]
        return all(n in names for n in ("POST /v1/completions", "llm generate", "decode")) and bool(tritons_llm_span())

    if not wait_for(arrived, timeout=60):
        every = sorted({(s["service"], s["name"], s["trace"] == TRACE_ID) for s in receiver.spans})
        tail = log.read_text()[-6000:]
        pytest.fail(f"spans (service, name, in the client's trace): {every}; unread: {receiver.errors}\n{tail}")
    (shim_span,) = [s for s in ours() if s["service"] == "tritonllm-shim"]
    assert shim_span["name"] == "POST /v1/completions" and shim_span["parent"] == CLIENT_SPAN
    requests = spans_named("InferRequest")  # Triton's, of the calls whose context it read: the shim's children
    assert all(r["parent"] == shim_span["span"] for r in requests)
    (llm_model,) = tritons_llm_span()
    (generate,) = spans_named("llm generate")
    assert generate["service"] == "tritonllm-llm"
    if llm_model["trace"] == TRACE_ID:  # Triton continued the trace: the llm's span is the child of its model span
        assert generate["parent"] == llm_model["span"]
        assert [r["span"] for r in requests].count(llm_model["parent"]) == 1  # the shim's call to the llm
    else:  # Triton started its own: the llm's span is the shim's child
        assert generate["parent"] == shim_span["span"]
    phases = {s["name"]: s for s in ours() if s["parent"] == generate["span"]}
    assert sorted(phases) == ["decode", "prefill", "queue"]
    output_tokens = phases["decode"]["attributes"]["gen_ai.usage.output_tokens"]
    assert (output_tokens.int_value if hasattr(output_tokens, "int_value") else int(output_tokens["intValue"])) == 5
    assert {s["trace"] for s in receiver.spans if s["name"] == "llm generate"} == {TRACE_ID}


def _text(value) -> str | None:
    """A string attribute, from the protobuf export (AnyValue) or the JSON one ({"stringValue": ...})."""
    if value is None:
        return None
    return value["stringValue"] if isinstance(value, dict) else value.string_value
