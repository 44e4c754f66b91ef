"""Faults survived by `serve`, on the real tritonserver: what a client sees when a part of the server dies, and
the server serving again by itself."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
from conftest import launch_triton
from triton_helpers import wait_for

from tritonllm.shim.settings import ShimSettings

from .conftest import running_serve, running_shim


def child_named(pid: int, fragment: str) -> psutil.Process:
    return next(p for p in psutil.Process(pid).children(recursive=True) if fragment in " ".join(p.cmdline()))


@pytest.mark.parametrize(
    ("victim", "reason", "noticed_within_s"),
    [
        ("tritonserver", ("tritonserver (exit code",), 5),
        # tritonserver 2.51 itself may abort when a stub dies holding their shared lock (boost's lock_exception)
        ("llm/1/model.py", ("llm model's process died", "tritonserver (exit code"), 10),
    ],
    ids=["tritonserver", "llm-stub"],
)
def test_a_part_killed_mid_stream(tiny_model_dir, tmp_path, victim, reason, noticed_within_s):
    """tritonserver 2.51 leaves a dead stub's streams hanging and its model refusing requests while it says
    ready; serve's supervisor ends the streams of a dead part (the llm's stub, or tritonserver itself) with an
    error, answers 503 with the reason, and restarts the server."""
    with running_serve(tiny_model_dir, tmp_path) as ports:
        shim = f"http://127.0.0.1:{ports['--shim-port']}"
        body = {"model": "tiny", "prompt": "Hi", "max_tokens": 1500, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{shim}/v1/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))  # streaming
            child_named(ports["pid"], victim).send_signal(signal.SIGKILL)
            killed = time.monotonic()
            rest = [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]
            assert time.monotonic() - killed < 30  # the stream ends, it does not hang
        assert "error" in rest[-1], rest[-1:]
        assert httpx.get(f"{shim}/health").status_code == 503
        restarting = lambda: any(r in httpx.get(f"{shim}/health").json().get("reason", "") for r in reason)  # noqa: E731
        assert wait_for(restarting, timeout=noticed_within_s)  # the supervisor looks every second
        refused = httpx.post(f"{shim}/v1/completions", json={**body, "stream": False, "max_tokens": 2}, timeout=30)
        assert refused.status_code == 503 and "restarting" in refused.json()["error"]["message"]
        assert wait_for(lambda: httpx.get(f"{shim}/health").status_code == 200, timeout=300, interval=0.5)
        again = httpx.post(f"{shim}/v1/completions", json={**body, "stream": False, "max_tokens": 2}, timeout=60)
        assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 2


def kernel_log_since(uptime: float) -> list[str]:
    """The kernel's log lines (where a process's segfault goes) stamped after `uptime` seconds since boot: its
    ring buffer holds hours, and process ids are reused. A test that needs it fails without it."""
    import subprocess

    read = subprocess.run(["dmesg"], capture_output=True, text=True)
    assert read.returncode == 0, f"the kernel log is unreadable here (dmesg: {read.stderr.strip()})"
    stamped = [(line[1 : line.find("]")].strip(), line) for line in read.stdout.splitlines() if line.startswith("[")]
    return [line for stamp, line in stamped if stamp.replace(".", "", 1).isdigit() and float(stamp) > uptime]


def uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def test_a_stop_ends_every_stub_without_a_crash(tiny_model_dir, tmp_path):
    """Every model's stub ends cleanly at a stop: none leaves a segfault in the kernel log or a fatal error in the
    server's log, and every model unloads. The llm's crashed at every stop, deleting its metrics after the stub's
    shared memory was gone; the preprocessing's when the last request it served failed in a chat template (jinja2
    keeps a failing template's traceback in a reference cycle, with the request in one of its frames, which the
    interpreter's exit collected after that memory was gone)."""
    started = uptime()
    with running_serve(tiny_model_dir, tmp_path, "--trust-request-chat-template") as ports:
        shim = f"http://127.0.0.1:{ports['--shim-port']}"
        body = {"model": "tiny", "prompt": "Hi", "max_tokens": 8}
        assert httpx.post(f"{shim}/v1/completions", json=body, timeout=60).status_code == 200
        assert httpx.post(f"{shim}/v1/embeddings", json={"input": "Hi"}, timeout=60).status_code == 200
        chat = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "Hi"}],
            "chat_template": "{{ raise_exception('no') }}",
        }
        failed = httpx.post(f"{shim}/v1/chat/completions", json=chat, timeout=60)
        assert failed.status_code == 400 and "could not render" in failed.json()["error"]["message"]
        stubs = [p for p in psutil.Process(ports["pid"]).children(recursive=True) if "_stub" in p.name()]
        assert len(stubs) >= 5, stubs
    psutil.wait_procs(stubs, timeout=30)
    since = kernel_log_since(started)
    crashed = [line for line in since if any(f"[{p.pid}]: segfault" in line for p in stubs)]
    assert not crashed, crashed
    # the llm's stub runs faulthandler: its crash is handled there, and told in the server's log instead
    log = (tmp_path / "serve.log").read_text()
    assert "Fatal Python error" not in log, log[log.index("Fatal Python error") :][:2000]
    assert_every_model_unloaded(log)


def assert_every_model_unloaded(log: str) -> None:
    for model in ("ensemble", "preprocessing", "llm", "postprocessing", "tensorrt_llm", "embedding"):
        assert f"successfully unloaded '{model}'" in log, (model, log[-3000:])
    assert "Exit timeout expired" not in log


def test_a_stop_with_a_client_still_connected_unloads_every_model(tiny_model_dir, tmp_path):
    """Triton unloads the llm only once every request it holds has had its final response, and a shim still
    connected holds its multiplexed channel open, a stream perhaps running on it. The llm sees the stop (the
    server's HTTP endpoint closes), lets the generation run until the exit timeout nearly ends, then ends it and
    closes the channel: every model unloads and every stub ends. Before, the llm never unloaded: tritonserver exited
    at its exit timeout and its stub was killed."""
    server = launch_triton(tiny_model_dir, tmp_path)
    events: list[dict] = []
    streaming = threading.Event()

    def stream(shim: str) -> None:
        body = {"model": "tiny", "prompt": "Hi", "max_tokens": 1500, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{shim}/v1/completions", json=body, timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    events.append(json.loads(line[6:]))
                    streaming.set()

    try:
        settings = ShimSettings(triton_grpc_url=server.grpc_url, served_model_name="tiny")
        with running_shim(settings) as shim:
            client = threading.Thread(target=stream, args=(shim,))
            client.start()
            assert streaming.wait(60)
            server.stop()
            client.join(60)
            assert not client.is_alive()
    finally:
        server.stop()
    ended = events[-1]
    assert "error" in ended or ended["choices"][0]["finish_reason"] == "length", ended
    if "error" in ended:
        assert ended["error"]["code"] == 503, ended
    assert_every_model_unloaded((tmp_path / "tritonserver.log").read_text())
