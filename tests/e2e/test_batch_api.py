"""OpenAI's Batch API with OpenAI's own SDK, against `tritonllm shim` processes of their own in front of the session's
tritonserver, each with a batch folder: a job's answers equal the routes' own, bad lines become error-file entries,
a cancelled job keeps what was answered, and a shim killed with SIGKILL mid-job finishes it at its next start with
every line answered exactly once."""

from __future__ import annotations

import collections
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from triton_helpers import pause_llm, wait_for

from tritonllm.launcher.tritonserver import free_port

from .conftest import EMBEDDING_MODEL, MODEL

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


class Shim:
    """`tritonllm shim` in a process of its own, which a test may kill and start again on the same folder."""

    def __init__(self, triton, folder: Path) -> None:
        self.triton, self.folder, self.port = triton, folder, free_port()
        self.process: subprocess.Popen | None = None

    def start(self) -> Shim:
        command = [str(Path(sys.executable).parent / "tritonllm"), "shim", "--triton-grpc-url", self.triton.grpc_url]
        command += ["--served-model-name", MODEL, "--port", str(self.port), "--batch-dir", str(self.folder)]
        log = (self.folder / "shim.log").open("a")
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        assert wait_for(self._healthy, timeout=60), (self.folder / "shim.log").read_text()
        return self

    def _healthy(self) -> bool:
        assert self.process.poll() is None, (self.folder / "shim.log").read_text()
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).is_success
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)

    @property
    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0)


@pytest.fixture
def shim(triton, tmp_path):
    running = Shim(triton, tmp_path).start()
    yield running
    running.stop()


def line(custom_id: str, body: dict, url: str = "/v1/chat/completions") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def chat_body(max_tokens: int = 8, **extra) -> dict:
    return {"model": MODEL, "messages": ASK, "max_tokens": max_tokens, "temperature": 0, **extra}


def upload(client: openai.OpenAI, lines: list) -> str:
    text = "\n".join(item if isinstance(item, str) else json.dumps(item) for item in lines) + "\n"
    return client.files.create(file=("requests.jsonl", text.encode()), purpose="batch").id


def finished(client: openai.OpenAI, batch_id: str, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} still {batch.status}")


def jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    return [] if file_id is None else [json.loads(t) for t in client.files.content(file_id).text.splitlines()]


def test_a_batch_answers_as_the_routes_do_and_bad_lines_are_error_entries(shim, openai_client):
    client = shim.client
    lines = [line(f"c{i}", chat_body(6 + i)) for i in range(3)]
    lines += [
        line("wrong-url", {"model": MODEL, "prompt": "x"}, url="/v1/completions"),
        "not json at all",
        line("c0", chat_body()),  # custom_id again
        line("too-long", chat_body(max_tokens=0)),  # the route's own 400
    ]
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "test"},
    )
    assert batch.status == "validating" and batch.metadata == {"job": "test"}
    batch = finished(client, batch.id)
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (7, 3, 4)
    answers = {item["custom_id"]: item for item in jsonl(client, batch.output_file_id)}
    assert sorted(answers) == ["c0", "c1", "c2"]
    for i in range(3):
        response = answers[f"c{i}"]["response"]
        direct = openai_client.chat.completions.create(**chat_body(6 + i))
        assert response["status_code"] == 200 and response["body"]["choices"][0]["message"]["content"] == (
            direct.choices[0].message.content
        )
    errors = jsonl(client, batch.error_file_id)
    assert len(errors) == 4
    refused = [e for e in errors if e["error"] is not None]
    assert sorted(str(e["custom_id"]) for e in refused) == ["None", "c0", "wrong-url"]
    (answered,) = [e for e in errors if e["error"] is None]
    assert answered["custom_id"] == "too-long" and answered["response"]["status_code"] == 400
    assert batch.id in [b.id for b in client.batches.list()]
    assert {batch.input_file_id, batch.output_file_id} <= {f.id for f in client.files.list()}


def test_an_embeddings_batch(shim):
    client = shim.client
    lines = [line(f"e{i}", {"model": EMBEDDING_MODEL, "input": f"text {i}"}, "/v1/embeddings") for i in range(2)]
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/embeddings", completion_window="24h"
    )
    batch = finished(client, batch.id)
    outputs = jsonl(client, batch.output_file_id)
    assert batch.status == "completed" and len(outputs) == 2
    assert all(len(o["response"]["body"]["data"][0]["embedding"]) == 384 for o in outputs)


def test_a_cancelled_batch_keeps_what_was_answered(shim, triton):
    client = shim.client
    pause_llm(triton.grpc_url, True)  # the lines wait in the engine: none answered before the cancel
    try:
        lines = [line(f"c{i}", chat_body()) for i in range(12)]
        batch = client.batches.create(
            input_file_id=upload(client, lines), endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert wait_for(lambda: client.batches.retrieve(batch.id).status == "in_progress", timeout=30)
        assert client.batches.cancel(batch.id).status == "cancelling"
    finally:
        pause_llm(triton.grpc_url, False)
    batch = finished(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    counts = batch.request_counts
    assert counts.total == 12 and 0 < counts.completed + counts.failed < 12  # the lines in flight, no more
    assert len(jsonl(client, batch.output_file_id)) == counts.completed


def test_a_shim_killed_mid_batch_finishes_it_at_its_next_start_answering_each_line_once(triton, tmp_path):
    shim = Shim(triton, tmp_path).start()
    client = shim.client
    # four short lines, then long ones: killed while the long ones run, the short ones' answers are kept
    lines = [line(f"short{i}", chat_body(2)) for i in range(4)]
    lines += [line(f"long{i}", chat_body(1000, ignore_eos=True)) for i in range(8)]
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert wait_for(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 4, timeout=120)
    shim.kill()
    database = sqlite3.connect(tmp_path / "batches.sqlite3")  # as the killed shim left it
    (body,) = database.execute("SELECT body FROM batches WHERE id = ?", (batch.id,)).fetchone()
    database.close()
    counts = json.loads(body)["request_counts"]
    assert 4 <= counts["completed"] < 12, counts  # killed mid-batch
    shim.start()
    try:
        done = finished(shim.client, batch.id, timeout=300)
        assert done.status == "completed" and done.request_counts.completed == 12
        ids = [o["custom_id"] for o in jsonl(shim.client, done.output_file_id)]
        assert collections.Counter(ids) == collections.Counter(item["custom_id"] for item in lines)
    finally:
        shim.stop()
