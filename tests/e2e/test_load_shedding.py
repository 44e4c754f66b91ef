"""Load shedding and priority through `tritonllm serve`, one sequence a step (`--max-num-seqs 1`) so that the order
of admission is the order of first tokens. The engine is paused while the requests arrive (they wait for admission
together), so no test depends on the machine's speed.

- a request of higher priority is admitted before those queued ahead of it;
- past `--max-queue-size`, a request is shed at once with a 429 that says when to come back (`Retry-After`);
- with `--max-queue-wait`, one that would wait longer than that behind the requests ahead of it, at the rate
  requests have been finishing, is shed the same way instead of waiting.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from triton_helpers import Stream, pause_llm, tensor, wait_for

from .conftest import running_serve

QUEUE = 4


def waiting(ports: dict) -> float:
    text = httpx.get(f"http://127.0.0.1:{ports['--metrics-port']}/metrics", timeout=5).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("tritonllm_requests_waiting{"))


@pytest.fixture(scope="module")
def queue_server(tiny_model_dir, tmp_path_factory):
    flags = ("--no-embedding", "--max-num-seqs", "1", "--max-queue-size", str(QUEUE))
    with running_serve(tiny_model_dir, tmp_path_factory.mktemp("shed"), *flags) as ports:
        yield ports


@pytest.fixture(scope="module")
def wait_server(tiny_model_dir, tmp_path_factory):
    flags = ("--no-embedding", "--max-num-seqs", "1", "--max-queue-wait", "0.001")
    with running_serve(tiny_model_dir, tmp_path_factory.mktemp("wait"), *flags) as ports:
        yield ports


def completion(priority: int | None = None, tokens: int = 4) -> dict:
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": tokens, "ignore_eos": True}
    return body | ({"priority": priority} if priority is not None else {})


def url(ports: dict) -> str:
    return f"http://127.0.0.1:{ports['--shim-port']}/v1/completions"


def grpc(ports: dict) -> str:
    return f"127.0.0.1:{ports['--grpc-port']}"


def test_a_higher_priority_request_is_admitted_before_those_queued_ahead_of_it(queue_server):
    """The order of admission read from the engine's own clock (TensorRT-LLM's perf metric first_scheduled_time_ns),
    not from when a client's thread reads a token, which a busy machine reorders."""
    streams: dict[str, Stream] = {}
    pause_llm(grpc(queue_server), True)
    try:
        for i, (name, priority) in enumerate([("low-0", 5), ("low-1", 5), ("low-2", 5), ("high", 1)]):
            streams[name] = Stream(grpc(queue_server))
            inputs = [
                tensor("text_input", [[b"Once upon a time"]], "BYTES"),
                tensor("max_tokens", [[4]], "INT32"),
                tensor("stream", [[True]], "BOOL"),
                tensor("priority", [[priority]], "INT32"),
                tensor("return_perf_metrics", [[True]], "BOOL"),
            ]
            streams[name].send("ensemble", inputs, request_id=name)
            assert wait_for(lambda i=i: waiting(queue_server) == i + 1, timeout=30)
        pause_llm(grpc(queue_server), False)
        scheduled = {n: s.until_final()[-1].as_numpy("first_scheduled_time_ns").item() for n, s in streams.items()}
    finally:
        pause_llm(grpc(queue_server), False)
        for stream in streams.values():
            stream.close()
    assert sorted(scheduled, key=scheduled.get) == ["high", "low-0", "low-1", "low-2"], scheduled


def test_past_the_queue_size_a_request_is_shed_at_once_saying_when_to_come_back(queue_server):
    pause_llm(grpc(queue_server), True)
    try:
        with ThreadPoolExecutor(QUEUE) as pool:
            queued = [pool.submit(httpx.post, url(queue_server), json=completion(), timeout=60) for _ in range(QUEUE)]
            assert wait_for(lambda: waiting(queue_server) == QUEUE, timeout=30)
            shed = httpx.post(url(queue_server), json=completion(), timeout=10)
            pause_llm(grpc(queue_server), False)
            assert all(r.result(timeout=60).status_code == 200 for r in queued)
    finally:
        pause_llm(grpc(queue_server), False)
    assert shed.status_code == 429, shed.text
    assert int(shed.headers["Retry-After"]) >= 1
    error = shed.json()["error"]
    assert error["param"] == "max_queue_size" and "overloaded" in error["message"], error


def test_a_request_that_would_wait_too_long_is_shed_at_once(wait_server):
    for _ in range(3):  # finished requests: the rate the wait is judged by
        assert httpx.post(url(wait_server), json=completion(), timeout=60).status_code == 200
    pause_llm(grpc(wait_server), True)
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(httpx.post, url(wait_server), json=completion(), timeout=60)
            assert wait_for(lambda: waiting(wait_server) == 1, timeout=30)
            shed = httpx.post(url(wait_server), json=completion(), timeout=10)
            urgent = pool.submit(httpx.post, url(wait_server), json=completion(priority=-4), timeout=60)
            assert wait_for(lambda: waiting(wait_server) == 2, timeout=30)  # nothing of its rank ahead of it
            pause_llm(grpc(wait_server), False)
            assert first.result(timeout=60).status_code == 200
            assert urgent.result(timeout=60).status_code == 200
    finally:
        pause_llm(grpc(wait_server), False)
    assert shed.status_code == 429, shed.text
    assert int(shed.headers["Retry-After"]) >= 1
    error = shed.json()["error"]
    assert error["param"] == "max_queue_wait" and "ahead" in error["message"], error


def test_a_batch_running_does_not_hold_up_a_chat(queue_server):
    """Batch lines wait behind every client's request: queued first, they are admitted after a chat sent later."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{queue_server['--shim-port']}/v1", api_key="-", max_retries=0)
    lines = [
        {"custom_id": f"b{i}", "method": "POST", "url": "/v1/completions", "body": completion(tokens=1900)}
        for i in range(QUEUE - 1)
    ]
    requests = "\n".join(json.dumps(item) for item in lines).encode()
    pause_llm(grpc(queue_server), True)
    try:
        file_id = client.files.create(file=("lines.jsonl", requests), purpose="batch").id
        batch = client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h")
        assert wait_for(lambda: waiting(queue_server) == QUEUE - 1, timeout=30)
        with ThreadPoolExecutor(1) as pool:
            chat = pool.submit(httpx.post, url(queue_server), json=completion(), timeout=60)
            assert wait_for(lambda: waiting(queue_server) == QUEUE, timeout=30)
            pause_llm(grpc(queue_server), False)
            assert chat.result(timeout=60).status_code == 200
        # the chat's 4 tokens are done before the first batch line's 1,900 (seconds of them): none is answered yet
        assert client.batches.retrieve(batch.id).request_counts.completed == 0
    finally:
        pause_llm(grpc(queue_server), False)
    assert wait_for(lambda: client.batches.retrieve(batch.id).status == "completed", timeout=120)
