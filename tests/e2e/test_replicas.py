"""Two replicas, each a whole `tritonllm serve` (tritonserver and shim) on ports of its own, behind a
round-robin client, as two pods behind a Service. One replica is killed outright mid-load: the requests it was
streaming fail at once with a connection error, every request on the other replica completes, and the client's
next requests all go to the replica that lives."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from conftest import MODELS, PROJECT_ROOT

from tritonllm.runtime.tritonserver import free_port

MAX_TOKENS = 400  # long enough to be streaming when the kill comes


@dataclass
class Replica:
    name: str
    process: subprocess.Popen
    shim_port: int
    metrics_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.shim_port}/v1"

    def processes(self) -> list[int]:
        """serve, its tritonserver and the tritonserver's stubs: everything a pod kill ends."""
        found, queue = [], [self.process.pid]
        while queue:
            pid = queue.pop()
            found.append(pid)
            try:
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                children = []
            queue += [int(child) for child in children]
        return found

    def kill(self) -> None:
        regions = []
        for pid in self.processes():
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                regions += [a.decode() for a in args if a.startswith(b"triton_python_backend_shm_region_")]
                os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass
        self.process.wait(10)
        for region in regions:
            Path("/dev/shm", region).unlink(missing_ok=True)

    def kv_blocks_used(self) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        lines = [line for line in text.splitlines() if line.startswith("tritonllm_kv_blocks_used{")]
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def start_replica(name: str, log_dir: Path) -> Replica:
    ports = [free_port() for _ in range(4)]
    command = [
        str(Path(sys.executable).parent / "tritonllm"),
        "serve",
        f"--model-dir={MODELS / 'tiny'}",
        f"--http-port={ports[0]}",
        f"--grpc-port={ports[1]}",
        f"--metrics-port={ports[2]}",
        f"--shim-port={ports[3]}",
    ]
    log = open(log_dir / f"{name}.log", "wb")  # noqa: SIM115 - the process writes it as long as it runs
    process = subprocess.Popen(command, cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT)
    return Replica(name, process, ports[3], ports[2])


def wait_ready(replica: Replica, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert replica.process.poll() is None, f"replica {replica.name} exited"
        try:
            with urllib.request.urlopen(f"{replica.url}/models", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"replica {replica.name} not ready after {timeout}s")


@pytest.fixture
def replicas(tmp_path):
    started = [start_replica(name, tmp_path) for name in ("a", "b")]
    try:
        for replica in started:
            wait_ready(replica)
        yield started
    finally:
        for replica in started:
            if replica.process.poll() is None:
                replica.process.send_signal(signal.SIGINT)  # serve stops its tritonserver and stubs
                try:
                    replica.process.wait(60)
                except subprocess.TimeoutExpired:
                    replica.kill()


class RoundRobin:
    """Each request to the next replica that has not failed; a replica whose connection failed is left out."""

    def __init__(self, replicas: list[Replica]) -> None:
        self.clients = {r.name: openai.AsyncOpenAI(base_url=r.url, api_key="unused", max_retries=0) for r in replicas}
        self.down: set[str] = set()
        self._turn = 0

    def pick(self) -> str:
        live = [name for name in self.clients if name not in self.down]
        self._turn += 1
        return live[self._turn % len(live)]

    async def chat(self, prompt: str, started: asyncio.Event | None = None) -> tuple[str, str | Exception]:
        name = self.pick()
        try:
            stream = await self.clients[name].chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=MAX_TOKENS,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            text, finish = "", None
            async for chunk in stream:
                if started is not None:
                    started.set()
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                    finish = chunk.choices[0].finish_reason or finish
            return name, finish or "no finish reason"
        except openai.APIConnectionError as e:
            self.down.add(name)
            return name, e


async def load_with_a_kill(replicas: list[Replica]) -> tuple[list, list]:
    router = RoundRobin(replicas)
    events = [asyncio.Event() for _ in range(8)]
    first = [asyncio.create_task(router.chat(f"request {i}", events[i])) for i in range(8)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 120)  # all eight are streaming
    replicas[1].kill()
    during = await asyncio.wait_for(asyncio.gather(*first), 120)
    after = await asyncio.wait_for(asyncio.gather(*(router.chat(f"after {i}") for i in range(8))), 120)
    return during, after


def test_a_killed_replica_fails_only_its_own_streams_and_the_client_goes_on_with_the_other(replicas):
    during, after = asyncio.run(load_with_a_kill(replicas))
    on_a = [outcome for name, outcome in during if name == "a"]
    on_b = [outcome for name, outcome in during if name == "b"]
    assert len(on_a) == len(on_b) == 4
    assert on_a == ["length"] * 4  # the survivor's streams ran to max_tokens
    assert all(isinstance(outcome, openai.APIConnectionError) for outcome in on_b)
    assert after == [("a", "length")] * 8
    deadline = time.monotonic() + 30
    while replicas[0].kv_blocks_used() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert replicas[0].kv_blocks_used() == 0
