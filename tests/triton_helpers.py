"""Talking to the real tritonserver in tests: tensors, gRPC streams, Prometheus metrics."""

from __future__ import annotations

import queue
import re
import time
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient

from tritonllm.launcher.tritonserver import TritonServer


def tensor(name: str, value, datatype: str) -> grpcclient.InferInput:
    array = np.array(value)
    if datatype == "BYTES":
        array = np.array(value, dtype=np.object_)
    else:
        types = {"INT32": np.int32, "BOOL": bool, "FP32": np.float32, "FP16": np.float16, "UINT64": np.uint64}
        array = array.astype(types[datatype])
    t = grpcclient.InferInput(name, list(array.shape), datatype)
    t.set_data_from_numpy(array)
    return t


class Stream:
    """One gRPC stream; responses (result or error) are collected in a queue."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.responses.put((result, error)))

    def send(self, model: str, inputs: list, request_id: str = "") -> None:
        self.client.async_stream_infer(model, inputs, request_id=request_id)

    def next(self, timeout: float = 30.0):
        result, error = self.responses.get(timeout=timeout)
        if error is not None:
            raise error
        return result

    def until_final(self, key: str = "finish_reason", timeout: float = 60.0) -> list:
        results = []
        while True:
            result = self.next(timeout)
            results.append(result)
            if result.as_numpy(key).reshape(-1)[0]:
                return results

    def cancel(self) -> None:
        self.client.stop_stream(cancel_requests=True)

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def metric(server: TritonServer, name: str, labels: str = "", instance: str | None = None) -> float:
    """The metric summed over the llm's instances (each has its own `instance` label), or one instance's;
    `labels`: others it must carry, as `reason="cancelled"`. A metric the server does not export is an error,
    not 0: a leak check (`== 0`) must fail when its metric goes missing."""
    series = metric_series(server, name, labels, instance)
    if not series:
        raise AssertionError(
            f"the server exports no {name}{{{labels}}} series" + (f" of {instance}" if instance else "")
        )
    return sum(value for _, value in series)


def metric_series(server: TritonServer, name: str, labels: str = "", instance: str | None = None) -> list:
    """(instance, value) for each series of the metric that carries `labels` (and is `instance`'s)."""
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    series = []
    for found in re.finditer(rf"^{re.escape(name)}\{{(.*?)\}}\s+([0-9.e+-]+)$", text, re.MULTILINE):
        label_text, value = found.groups()
        where = re.search(r'instance="([^"]*)"', label_text)
        if labels in label_text and (instance is None or (where and where.group(1) == instance)):
            series.append((where.group(1) if where else None, float(value)))
    return series


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def pause_llm(grpc_url: str, paused: bool, llm: str = "llm") -> None:
    """Pauses (or resumes) the llm instance Triton hands the request to: with one instance, the engine. Requests
    sent meanwhile wait for admission, so that they are admitted together, by rank, when it resumes."""
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        client.start_stream(callback=lambda result, error: None)
        client.async_stream_infer(llm, [tensor("pause", [[paused]], "BOOL")])
    finally:
        client.stop_stream()
        client.close()
