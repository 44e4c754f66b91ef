"""The shim, served by uvicorn on a free loopback port, in front of the integration tests' tritonserver."""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from conftest import MODELS, PROJECT_ROOT, launch_triton

from tritonllm.launcher.tritonserver import free_port, free_ports
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


@contextlib.contextmanager
def running_serve(
    model_dir: Path, log_dir: Path, *flags: str, scheme: str = "http", verify: Path | bool = True
) -> Iterator[dict[str, int]]:
    """`tritonllm serve` itself, in a process of its own on free loopback ports, until its shim's /health
    answers (over `scheme`, the certificate checked against `verify`); yields the ports by flag, and serve's
    process id as "pid"."""
    import httpx

    listeners = ("--http-port", "--grpc-port", "--metrics-port", "--shim-port")
    ports = dict(zip(listeners, free_ports(len(listeners)), strict=True))
    command = [str(Path(sys.executable).parent / "tritonllm"), "serve", "--model-dir", str(model_dir), *flags]
    if "--batch-dir" not in flags:  # not the user's cache: a batch left there would be taken up by every start
        command += ["--batch-dir", str(log_dir / "batches")]
    command += [str(v) for pair in ports.items() for v in pair]
    log_path = log_dir / "serve.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while True:
                assert process.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "serve did not get healthy"
                try:
                    health = f"{scheme}://127.0.0.1:{ports['--shim-port']}/health"
                    trusted = ssl.create_default_context(cafile=verify) if isinstance(verify, Path) else verify
                    if httpx.get(health, timeout=2, verify=trusted).is_success:
                        break
                except httpx.HTTPError:
                    time.sleep(0.3)
            yield {**ports, "pid": process.pid}
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(60)


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


@contextlib.contextmanager
def triton_and_shim(model_dir: Path, log_dir: Path, name: str, tool_call_parser: str) -> Iterator[str]:
    """A tritonserver of its own serving `model_dir` as `name`, and the shim in front of it; yields its URL."""
    server = launch_triton(model_dir, log_dir)
    try:
        settings = ShimSettings(
            triton_grpc_url=server.grpc_url, served_model_name=name, tool_call_parser=tool_call_parser
        )
        with running_shim(settings) as url:
            yield url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def smollm2_url(smollm2_dir, tmp_path_factory):
    """The shim in front of a tritonserver serving the real default model; its tool calls in the json format."""
    with triton_and_shim(smollm2_dir, tmp_path_factory.mktemp("triton-smollm2"), SMOLLM2, "json") as url:
        yield url


CLIENTS = PROJECT_ROOT / os.environ.get("TRITONLLM_CLIENTS_VENV", ".venv-clients") / "bin"  # relative: to the project
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_tool(
    tool: str, args: list[str], cwd: Path, timeout: float, path_prefix: Path | None = None, offline: bool = True
) -> None:
    """Runs a client tool from its venv (make clients) and asserts it succeeded. `offline` False: aiperf 0.13 in HF
    offline mode looks a local tokenizer directory up in the hub's cache and fails; there is no network anyway."""
    exe = CLIENTS / tool
    if not exe.exists():
        pytest.fail(f"{exe} is missing: `make clients` installs the client tools (make test does)")
    env = {**os.environ, **OFFLINE}
    if not offline:
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            env.pop(name, None)
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    done = subprocess.run([str(exe), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{tool} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
