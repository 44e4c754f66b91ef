"""The shim with no Triton behind it: a 503 that says so, not a 4xx blaming the request nor a bare 500."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tritonllm.launcher.tritonserver import free_port
from tritonllm.shim.app import create_app
from tritonllm.shim.errors import UNAVAILABLE_RETRY_AFTER_S
from tritonllm.shim.settings import ShimSettings


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/completions", {"model": "tiny", "prompt": "Hello", "max_tokens": 4}),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
        ("/v1/embeddings", {"model": "all-MiniLM-L6-v2", "input": "Hello"}),
    ],
)
def test_requests_get_503_when_triton_is_unreachable(route, body):
    settings = ShimSettings(triton_grpc_url=f"127.0.0.1:{free_port()}", served_model_name="tiny")
    with TestClient(create_app(settings)) as client:
        response = client.post(route, json=body)
        health = client.get("/health")
    assert health.status_code == 503 and health.headers["Retry-After"] == str(UNAVAILABLE_RETRY_AFTER_S)
    assert response.status_code == 503 and response.headers["Retry-After"] == str(UNAVAILABLE_RETRY_AFTER_S)
    assert response.json()["error"]["type"] == "server_error"
