"""Talking to the real tritonserver in tests: tensors, gRPC streams, Prometheus metrics."""

from __future__ import annotations

import queue
import re
import time
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient

from tritonllm.runtime.tritonserver import TritonServer


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


def metric(server: TritonServer, name: str, labels: str = "") -> float:
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    pattern = rf"^{re.escape(name)}{re.escape('{' + labels + '}') if labels else ''}\s+([0-9.e+-]+)$"
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
