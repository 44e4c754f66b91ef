"""gRPC streams to the session's tritonserver, closed after each test."""

from __future__ import annotations

import pytest
from triton_helpers import Stream


@pytest.fixture
def stream(triton):
    streams: list[Stream] = []

    def open_stream() -> Stream:
        streams.append(Stream(triton.grpc_url))
        return streams[-1]

    yield open_stream
    for s in streams:
        s.close()
