"""The shim's only way to the model: gRPC streaming to the Triton `ensemble`, and `stop` requests to `llm`.

Triton does not forward a cancelled stream into the steps of an ensemble, so when a caller goes away before
the generation ends, the stream is cancelled AND a `stop` request with the same request id goes to `llm`,
which ends the sequence and frees its KV blocks within one engine step.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

ENSEMBLE = "ensemble"
LLM = "llm"


class TritonRequestError(Exception):
    """Triton answered the request with an error (bad input, or the server failed)."""


@dataclass
class GenerationRequest:
    max_tokens: int
    text: str | None = None
    messages: list[dict] | None = None
    tools: list[dict] | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    priority: int | None = None  # 1 highest .. 5 lowest
    timeout_ms: int | None = None  # the engine ends the generation with finish reason "timeout"
    stream: bool = True
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def inputs(self) -> list[grpcclient.InferInput]:
        tensors: list[tuple[str, str, np.ndarray]] = [
            ("max_tokens", "INT32", np.array([[self.max_tokens]], dtype=np.int32)),
            ("stream", "BOOL", np.array([[self.stream]], dtype=bool)),
        ]
        if self.messages is not None:
            tensors.append(("chat_messages", "BYTES", _bytes(json.dumps(self.messages))))
            if self.tools:
                tensors.append(("chat_tools", "BYTES", _bytes(json.dumps(self.tools))))
        else:
            tensors.append(("text_input", "BYTES", _bytes(self.text or "")))
        optional = [
            ("temperature", "FP32", np.float32, self.temperature),
            ("top_k", "INT32", np.int32, self.top_k),
            ("top_p", "FP32", np.float32, self.top_p),
            ("random_seed", "UINT64", np.uint64, self.seed),
            ("priority", "INT32", np.int32, self.priority),
            ("timeout_ms", "INT32", np.int32, self.timeout_ms),
        ]
        tensors += [
            (name, dt, np.array([[value]], dtype=np_t)) for name, dt, np_t, value in optional if value is not None
        ]
        return [_infer_input(name, dt, array) for name, dt, array in tensors]


@dataclass
class Chunk:
    text: str
    finish_reason: str  # "" until the last chunk
    num_input_tokens: int
    num_output_tokens: int
    batch_size: int
    queue_wait_us: int

    @classmethod
    def from_result(cls, result) -> Chunk:
        def scalar(name: str):
            return result.as_numpy(name).reshape(-1)[0]

        return cls(
            text=b"".join(result.as_numpy("text_output").reshape(-1)).decode("utf-8"),
            finish_reason=scalar("finish_reason").decode(),
            num_input_tokens=int(scalar("num_input_tokens")),
            num_output_tokens=int(scalar("num_output_tokens")),
            batch_size=int(scalar("batch_size")),
            queue_wait_us=int(scalar("queue_wait_us")),
        )


def _bytes(text: str) -> np.ndarray:
    return np.array([[text.encode("utf-8")]], dtype=np.object_)


def _infer_input(name: str, datatype: str, array: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


class TritonLLMClient:
    def __init__(self, url: str) -> None:
        self.url = url
        self._client = grpcclient.InferenceServerClient(url)
        self._stops: set[asyncio.Task] = set()

    async def close(self) -> None:
        await self._client.close()

    async def ready(self) -> bool:
        try:
            return await self._client.is_model_ready(ENSEMBLE)
        except InferenceServerException:
            return False

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """Yields chunks until the one with a finish reason; ends the generation if the caller stops early."""
        stream = self._open(ENSEMBLE, request.inputs(), request.request_id)
        done = False
        try:
            async for result, error in stream:
                if error is not None:
                    raise TritonRequestError(error.message())
                chunk = Chunk.from_result(result)
                done = bool(chunk.finish_reason)
                yield chunk
                if done:
                    return
        except InferenceServerException as e:
            raise TritonRequestError(e.message()) from e
        finally:
            if not done:
                stream.cancel()
                # Not awaited here: this runs while the caller's task is being torn down.
                task = asyncio.get_running_loop().create_task(self.stop(request.request_id))
                self._stops.add(task)
                task.add_done_callback(self._stops.discard)

    async def stop(self, request_id: str) -> None:
        """Ends the llm sequences that carry `request_id`."""
        stop = _infer_input("stop", "BOOL", np.array([[True]], dtype=bool))
        async for _, error in self._open(LLM, [stop], request_id):
            if error is not None:
                raise TritonRequestError(error.message())
            return

    def _open(self, model: str, inputs: list, request_id: str):
        async def one_request():
            yield {"model_name": model, "inputs": inputs, "request_id": request_id}

        return self._client.stream_infer(one_request())
