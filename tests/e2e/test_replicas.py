"""Two replicas on ports of their own behind a round-robin client, as two pods behind a Service: one a whole
`tritonllm serve`, the other laid out as the Helm chart's pod (`serve --no-shim` plus `tritonllm shim`).

The second is killed outright mid-load: the requests it was streaming fail at once with a connection error,
every request on the first completes, and the client's next requests all go to the one that lives. Then the
first gets SIGTERM mid-load, as a pod being replaced does: it finishes its streams before it exits."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from conftest import MODELS, PROJECT_ROOT
from triton_helpers import metric, wait_for

from tritonllm.launcher.tritonserver import free_ports

MAX_TOKENS = 400  # long enough to be streaming when the kill comes
DRAIN_S = 600


@dataclass
class Replica:
    name: str
    started: list[subprocess.Popen]  # serve, or serve --no-shim and the shim
    shim_port: int
    metrics_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.shim_port}/v1"

    def processes(self) -> list[int]:
        """serve, its tritonserver and the tritonserver's stubs: everything a pod kill ends."""
        found, queue = [], [p.pid for p in self.started]
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
        for process in self.started:
            process.wait(10)
        for region in regions:
            Path("/dev/shm", region).unlink(missing_ok=True)

    @property
    def metrics_url(self) -> str:  # as TritonServer's, for triton_helpers.metric
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def ready(self) -> bool:
        """The pod's readiness probe: the shim's /health, which asks Triton (its /v1/models answers before)."""
        assert all(p.poll() is None for p in self.started), f"replica {self.name} exited"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.shim_port}/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False


def start_replica(name: str, log_dir: Path, as_pod: bool = False) -> Replica:
    http, grpc, metrics, shim = free_ports(4)
    cli = str(Path(sys.executable).parent / "tritonllm")
    serve = [cli, "serve", f"--model-dir={MODELS / 'tiny'}", f"--http-port={http}", f"--grpc-port={grpc}"]
    # The drain is an upper bound, as a pod's terminationGracePeriodSeconds: generous, so that the SIGTERM case
    # holds on a machine of any speed (the streams end as soon as they have their tokens).
    serve += [f"--metrics-port={metrics}", f"--shim-port={shim}", f"--drain-seconds={DRAIN_S}"]
    commands = [serve]
    if as_pod:
        serve.append("--no-shim")
        commands.append(
            [cli, "shim", f"--triton-grpc-url=127.0.0.1:{grpc}", f"--port={shim}", "--served-model-name=tiny"]
        )
    log = open(log_dir / f"{name}.log", "wb")  # noqa: SIM115 - the processes write it as long as they run
    started = [subprocess.Popen(c, cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT) for c in commands]
    return Replica(name, started, shim, metrics)


@pytest.fixture
def replicas(tmp_path):
    replicas = [start_replica("a", tmp_path), start_replica("b", tmp_path, as_pod=True)]
    try:
        for replica in replicas:
            assert wait_for(replica.ready, timeout=600, interval=0.5), f"replica {replica.name} not ready"
        yield replicas
    finally:
        for replica in replicas:
            for process in replica.started:
                if process.poll() is None:
                    process.send_signal(signal.SIGINT)  # serve stops its tritonserver and stubs
            try:
                for process in replica.started:
                    process.wait(60)
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

    async def chat(
        self, prompt: str, started: asyncio.Event | None = None, name: str | None = None
    ) -> tuple[str, str | Exception]:
        name = name or self.pick()
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


async def streaming(router: RoundRobin, count: int, on: str | None = None) -> list[asyncio.Task]:
    """`count` requests, returned once every one of them (or every one sent to the replica `on`) is streaming."""
    names = [router.pick() for _ in range(count)]
    events = [asyncio.Event() for _ in range(count)]
    tasks = [asyncio.create_task(router.chat(f"request {i}", events[i], names[i])) for i in range(count)]
    for name, event, task in zip(names, events, tasks, strict=True):
        if on is not None and name != on:
            continue
        # a request that ends before it streams (an error answer) ends the wait with its outcome
        streams = asyncio.create_task(event.wait())
        await asyncio.wait([streams, task], timeout=120, return_when=asyncio.FIRST_COMPLETED)
        streams.cancel()
        assert event.is_set(), f"a request did not stream: {task.result() if task.done() else 'no answer in 120 s'}"
    return tasks


async def load_with_a_kill_then_a_sigterm(replicas: list[Replica]) -> tuple[list, list, list]:
    router = RoundRobin(replicas)
    # killed as soon as its own streams run: waiting for the other replica's too could let them end first
    first = await streaming(router, 8, on="b")
    replicas[1].kill()
    during = await asyncio.wait_for(asyncio.gather(*first), 120)
    after = await asyncio.wait_for(asyncio.gather(*(router.chat(f"after {i}") for i in range(8))), 120)
    # nothing else runs: a plain wait
    assert wait_for(lambda: metric(replicas[0], "tritonllm_kv_blocks_used") == 0, timeout=30)
    last = await streaming(router, 4)
    replicas[0].started[0].send_signal(signal.SIGTERM)  # a pod being replaced
    drained = await asyncio.wait_for(asyncio.gather(*last), DRAIN_S)
    return during, after, drained


def test_a_killed_replica_fails_only_its_own_streams_and_a_stopped_one_finishes_its_own(replicas):
    during, after, drained = asyncio.run(load_with_a_kill_then_a_sigterm(replicas))
    on_a = [outcome for name, outcome in during if name == "a"]
    on_b = [outcome for name, outcome in during if name == "b"]
    assert len(on_a) == len(on_b) == 4
    assert on_a == ["length"] * 4  # the survivor's streams ran to max_tokens
    assert all(isinstance(outcome, openai.APIConnectionError) for outcome in on_b), on_b
    assert after == [("a", "length")] * 8
    assert drained == [("a", "length")] * 4  # SIGTERM let the streams finish
    assert replicas[0].started[0].wait(60) == 0
