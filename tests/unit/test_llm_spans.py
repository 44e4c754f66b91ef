"""Which context the llm's spans go under (backend/llm_spans.py): Triton's, where Triton continued the shim's
trace, else the shim's own `traceparent` request parameter. Triton 2.51 reads gRPC metadata values as C strings, so
at times it drops the client's trace and starts its own (tests/e2e/test_traces.py sees both cases)."""

from __future__ import annotations

import json

from tritonllm.backend import llm_spans

SHIM = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRITON_SAME_TRACE = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"
TRITON_OWN_TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Trace:
    def __init__(self, context: str) -> None:
        self.context = context

    def get_context(self) -> str:
        return self.context


class Request:
    """The two things of a Python backend request the spans read."""

    def __init__(self, triton: str | None, sent: str | None) -> None:
        self._trace = Trace(json.dumps({"traceparent": triton}) if triton else "")
        self._parameters = json.dumps({"traceparent": sent} if sent else {})

    def trace(self) -> Trace:
        return self._trace

    def parameters(self) -> str:
        return self._parameters


def test_spans_go_under_tritons_span_where_triton_continued_the_shims_trace():
    assert llm_spans._carrier(Request(TRITON_SAME_TRACE, SHIM)) == {"traceparent": TRITON_SAME_TRACE}


def test_spans_go_under_the_shims_span_where_triton_started_a_trace_of_its_own():
    assert llm_spans._carrier(Request(TRITON_OWN_TRACE, SHIM)) == {"traceparent": SHIM}


def test_without_the_shims_parameter_tritons_context_is_the_one():
    assert llm_spans._carrier(Request(TRITON_OWN_TRACE, None)) == {"traceparent": TRITON_OWN_TRACE}
    assert llm_spans._carrier(Request(None, None)) is None


def test_without_tritons_context_the_shims_parameter_is_the_one():
    assert llm_spans._carrier(Request(None, SHIM)) == {"traceparent": SHIM}
