"""The shim, served by uvicorn on a free loopback port, in front of the integration tests' tritonserver."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from conftest import MODELS, launch_triton

from tritonllm.runtime.tritonserver import free_port
from tritonllm.shim.app import create_app
from tritonllm.shim.settings import ShimSettings

MODEL = "tiny"
SMOLLM2 = "SmolLM2-135M-Instruct"  # the real default model
EMBEDDING_MODEL = "all-MiniLM-L6-v2"  # the shim's default name for it


@contextlib.contextmanager
def running_shim(settings: ShimSettings) -> Iterator[str]:
    """The shim on a free loopback port, in a thread of this process; yields its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "the shim did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="session")
def shim_url(triton):
    settings = ShimSettings(
        triton_grpc_url=triton.grpc_url, served_model_name=MODEL, default_max_tokens=32, tool_call_parser="hermes"
    )
    with running_shim(settings) as url:
        yield url


@pytest.fixture(scope="session")
def openai_client(shim_url):
    from openai import OpenAI

    return OpenAI(base_url=f"{shim_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    path = MODELS / SMOLLM2
    if not (path / "config.json").exists():
        pytest.fail(f"{path} is missing: `make model` converts it (make test does)")
    return path


@pytest.fixture(scope="session")
def smollm2_url(smollm2_dir, tmp_path_factory):
    """The shim in front of a tritonserver serving the real default model; its tool calls in the json format."""
    server = launch_triton(smollm2_dir, tmp_path_factory.mktemp("triton-smollm2"))
    try:
        settings = ShimSettings(triton_grpc_url=server.grpc_url, served_model_name=SMOLLM2, tool_call_parser="json")
        with running_shim(settings) as url:
            yield url
    finally:
        server.stop()
