"""The shim's only way to the model: gRPC to Triton. Generations stream from the `ensemble`, or from `llm` after a
`preprocessing` request (direct_route.py, the default); `stop` requests go to `llm`.

The shim never cancels a gRPC call. tritonserver 2.51 can crash (SIGSEGV in its gRPC frontend) when a call is
cancelled while its responses complete, a race fixed upstream only in 25.04 (triton-inference-server/server
#7840, #8078); and Triton does not forward a cancelled stream into the steps of an ensemble anyway. So when a
caller goes away before the generation ends, a `stop` request with the same request id goes to `llm`, which
ends the sequence and frees its KV blocks within one engine step, and the stream is read to its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator, Coroutine

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from tritonllm.common import tracing
from tritonllm.shim.direct_route import DirectRoute
from tritonllm.shim.mux_channel import MuxChannel
from tritonllm.shim.triton_call import Call
from tritonllm.shim.triton_errors import TritonRequestError, TritonUnavailable
from tritonllm.shim.triton_requests import (
    GenerationRequest,
    Tokenized,
    TokenizeRequest,
    bytes_tensor,
    infer_input,
    infer_inputs,
    text_rows,
    whole_response_inputs,
)
from tritonllm.shim.triton_responses import (
    ResponseDelta,
    all_outputs,
    ensemble_delta,
    output_tensor,
    string_output,
)
from tritonllm.wire import multiplex
from tritonllm.wire.api_key import GRPC_API_KEY_HEADER
from tritonllm.wire.triton_names import REPOSITORY_NAMES, TritonNames

EMBEDDING = "embedding"


RERANKER = "reranker"


FINISH_GRACE_S = 30.0  # how long an abandoned call may take to end after its stop before it is cancelled


RECONNECT_MS = 1000


def _lora_not_held(error: TritonRequestError) -> bool:
    """An error naming the task id: the llm does not hold the adapter (or serves no LoRA at all, which the resend
    with the weights then answers with the same error)."""
    return error.typed is not None and error.typed.param == "lora_task_id"


def _channel_args() -> list[tuple[str, int]]:
    """tritonclient's own options, with reconnection tried each second: a shim that starts before its
    tritonserver (a pod's two containers), or outlives a restart of it, is ready as soon as Triton is, not after
    gRPC's backoff (which grows to 120 s)."""
    keepalive = grpcclient.KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_MS),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_MS),
    ]


class TritonLLMClient:
    def __init__(
        self, url: str, api_key: str | None = None, direct: bool = True, names: TritonNames = REPOSITORY_NAMES
    ) -> None:
        """`api_key`: sent as the header a key-guarded tritonserver asks for (launcher/tritonserver.py).
        `direct`: generations run the ensemble's steps from here where they can (direct_route.py); False, through
        the ensemble. `names`: the Triton models of the LLM it serves."""
        self.names = names
        self._client = grpcclient.InferenceServerClient(url, channel_args=_channel_args())
        self._headers = {GRPC_API_KEY_HEADER: api_key} if api_key else None
        self._background: set[asyncio.Task] = set()
        self._route: DirectRoute | None = None
        self._route_known = not direct
        self._route_lock = asyncio.Lock()
        self._mux: MuxChannel | None = None
        self._mux_refused = False  # an llm without multiplexed channels: not asked again
        self._mux_lock = asyncio.Lock()

    async def close(self) -> None:
        await self._close_mux()
        if self._background:
            await asyncio.wait(self._background, timeout=FINISH_GRACE_S)
        await self._client.close()

    async def ready(self) -> bool:
        try:
            return await self._client.is_model_ready(self.names.ensemble, headers=self._headers)
        except InferenceServerException:
            return False

    async def load(self) -> None:
        """Loads the LLM's ensemble and with it its steps (Triton's explicit model control); returns once loaded."""
        try:
            await self._client.load_model(self.names.ensemble, headers=self._headers)
        except InferenceServerException as e:
            raise TritonRequestError(e.message()) from e

    async def unload(self) -> None:
        """Begins to unload the LLM's ensemble and its steps; Triton lets their requests in flight finish (the
        multiplexed channel, open while the llm lives, is ended first)."""
        async with self._mux_lock:
            await self._close_mux()
        try:
            await self._client.unload_model(self.names.ensemble, headers=self._headers, unload_dependents=True)
        except InferenceServerException as e:
            raise TritonRequestError(e.message()) from e

    async def model_states(self) -> dict[str, str]:
        """Each model's state in the server's repository (READY, LOADING, UNLOADING, UNAVAILABLE), if it has one."""
        try:
            index = await self._client.get_model_repository_index(headers=self._headers)
        except InferenceServerException as e:
            raise TritonUnavailable(e.message()) from e
        return {model.name: model.state for model in index.models if model.state}

    async def generate(self, request: GenerationRequest) -> AsyncIterator[ResponseDelta]:
        """Yields deltas until the one with a finish reason; ends the generation if the caller stops early. A
        LoRA adapter the llm does not hold (never sent to it, or forgotten for newer ones) is sent once more with
        its weights, under a new request id (the first one's stop may still be on its way)."""
        try:
            async with contextlib.aclosing(self._generate(request)) as deltas:
                async for delta in deltas:
                    yield delta
            return
        except TritonRequestError as e:
            if request.lora is None or request.lora_weights_attached or not _lora_not_held(e):
                raise
        retry = dataclasses.replace(request, lora_weights_attached=True, request_id=uuid.uuid4().hex)
        async with contextlib.aclosing(self._generate(retry)) as deltas:
            async for delta in deltas:
                yield delta

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[ResponseDelta]:
        route, mux = await self.direct_route(), None
        if route is None:
            call = self._open(self.names.ensemble, request.inputs(), request.request_id)
            to_delta = ensemble_delta
        else:
            tensors = request.tensors()
            wanted = list(route.preprocessing_outputs)
            preprocessed = await self._infer(
                self.names.preprocessing, infer_inputs(route.preprocessing_request(tensors)), wanted
            )
            llm_inputs = route.llm_request(tensors, [output_tensor(preprocessed, name) for name in wanted])
            mux = await self._mux_channel()
            if mux is not None:
                llm_inputs.append((multiplex.CHANNEL, "BYTES", bytes_tensor(mux.id)))
            call = self._open(self.names.llm, infer_inputs(llm_inputs), request.request_id, late_rows=mux is not None)
            if mux is not None:
                mux.listen(request.request_id, call.deliver)
                mux.hold(call.reader)

            def to_delta(result) -> ResponseDelta:
                outputs = result.arrays if isinstance(result, multiplex.Row) else all_outputs(result)
                return ResponseDelta.from_outputs(route.outputs(outputs).get)

        done, finals = False, 0
        try:
            async for result, error in call:
                if error is not None:
                    raise TritonRequestError(error.message(), request.request_id)
                if not isinstance(result, multiplex.Row) and not result.get_response().outputs:
                    continue  # a multiplexed generation's own FINAL response
                delta = to_delta(result)
                finals += bool(delta.finish_reason)
                done = finals == request.num_finals
                yield delta
                if done:
                    return
        finally:
            if mux is not None:
                mux.forget(request.request_id)
            if not done:
                # Not awaited here: this runs while the caller's task is being torn down.
                self._run_in_background(self._end(call, request.request_id))

    async def direct_route(self) -> DirectRoute | None:
        """The route past the ensemble, found at the first generation; None: through the ensemble."""
        async with self._route_lock:
            if not self._route_known:
                try:
                    config = await self._client.get_model_config(self.names.ensemble, headers=self._headers)
                except InferenceServerException as e:
                    raise TritonUnavailable(e.message()) from e
                snapshot = await self._infer(
                    self.names.preprocessing,
                    [infer_input("text_input", "BYTES", bytes_tensor(""))],
                    ["tokenizer_snapshot"],
                )
                self._route = DirectRoute.of(config.config, string_output(snapshot, "tokenizer_snapshot"), self.names)
                self._route_known = True
        return self._route

    async def _close_mux(self) -> None:
        if self._mux is not None:
            await self._close_channel(self._mux)

    async def _close_channel(self, channel: MuxChannel) -> None:
        if not channel.closed:
            with contextlib.suppress(TritonRequestError, TritonUnavailable, TimeoutError):
                await self.stop(channel.id)
                await asyncio.wait_for(channel.closing(), FINISH_GRACE_S)

    async def _retire(self, channel: MuxChannel) -> None:
        """Closes a worn channel once the generations sent on it have ended."""
        await channel.unheld()
        await self._close_channel(channel)

    async def _mux_channel(self) -> MuxChannel | None:
        """The llm's multiplexed channel for this shim's generations, opened at the first, again after it closed (a
        restarted llm) and when it is worn (mux_channel.py); None where the llm refuses it."""
        async with self._mux_lock:
            if self._mux is not None and not self._mux.closed and self._mux.worn:
                self._run_in_background(self._retire(self._mux))
                self._mux = None
            if (self._mux is None or self._mux.closed) and not self._mux_refused:
                channel_id = f"mux-{uuid.uuid4().hex}"
                opening = self._open(
                    self.names.llm, [infer_input(multiplex.OPEN, "BOOL", np.array([[True]]))], channel_id, traced=False
                )
                channel = MuxChannel(channel_id, opening, all_outputs)
                opened = await channel.open()
                self._mux_refused = channel.refusal is not None
                self._mux = channel if opened else None
        return self._mux if self._mux is not None and not self._mux.closed else None

    async def embed(self, rows: list[str] | list[list[int]], instruction: str | None) -> tuple[np.ndarray, np.ndarray]:
        """Each text's (or token-id list's) vector [rows, dimension] and token count [rows] from the `embedding`
        model."""
        if isinstance(rows[0], list):
            lengths = np.array([[len(ids)] for ids in rows], dtype=np.int32)
            padded = np.zeros((len(rows), int(lengths.max())), dtype=np.int32)
            for row, ids in enumerate(rows):
                padded[row, : len(ids)] = ids
            inputs = [infer_input("input_ids", "INT32", padded), infer_input("input_lengths", "INT32", lengths)]
        else:
            texts = text_rows(rows)
            inputs = [infer_input("text_input", "BYTES", texts)]
            if instruction:
                inputs.append(infer_input("instruction", "BYTES", np.full_like(texts, instruction.encode("utf-8"))))
        result = await self._infer(EMBEDDING, inputs)
        return result.as_numpy("embedding"), result.as_numpy("num_input_tokens").reshape(-1)

    async def score(self, queries: list[str], documents: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each (query, document) pair's relevance [rows] and token count [rows] from the `reranker` model."""
        inputs = [
            infer_input("query", "BYTES", text_rows(queries)),
            infer_input("document", "BYTES", text_rows(documents)),
        ]
        result = await self._infer(RERANKER, inputs)
        return result.as_numpy("score").reshape(-1), result.as_numpy("num_input_tokens").reshape(-1)

    async def tokenize(self, request: TokenizeRequest) -> Tokenized:
        """The prompt's ids as `preprocessing` makes them for a generation, with their token strings."""
        outputs = ["input_ids", "context_len", *(["token_strs"] if request.token_strs else [])]
        result = await self._infer(self.names.preprocessing, request.inputs(), outputs)
        strs = result.as_numpy("token_strs") if request.token_strs else None
        return Tokenized(
            ids=result.as_numpy("input_ids").reshape(-1).tolist(),
            context_len=int(result.as_numpy("context_len").reshape(-1)[0]),
            token_strs=None if strs is None else [t.decode("utf-8") for t in strs.reshape(-1)],
        )

    async def detokenize(self, ids: list[int]) -> str:
        """The text of `ids` as `postprocessing` makes a generation's last response (special tokens kept)."""
        result = await self._infer(self.names.postprocessing, whole_response_inputs(ids), ["text_output"])
        return result.as_numpy("text_output").reshape(-1)[0].decode("utf-8")

    async def tokenizer_info(self) -> dict:
        """The tokenizer's special tokens, chat template and context, from `preprocessing`."""
        # Triton takes no request without an input; preprocessing reads none when asked for this alone
        result = await self._infer(
            self.names.preprocessing, [infer_input("text_input", "BYTES", bytes_tensor(""))], ["tokenizer_info"]
        )
        return json.loads(string_output(result, "tokenizer_info"))

    async def _infer(self, model: str, inputs: list, outputs: list[str] | None = None):
        """One request, one response; shielded, so that a caller going away does not cancel the call."""
        wanted = [grpcclient.InferRequestedOutput(name) for name in outputs] if outputs else None
        call = self._run_in_background(self._client.infer(model, inputs, outputs=wanted, headers=self._call_headers()))
        try:
            return await asyncio.shield(call)
        except InferenceServerException as e:
            if e.status() == str(grpc.StatusCode.UNAVAILABLE):
                raise TritonUnavailable(e.message()) from e
            raise TritonRequestError(e.message()) from e

    async def stop(self, request_id: str) -> None:
        """Ends the llm sequences that carry `request_id`."""
        stop = infer_input("stop", "BOOL", np.array([[True]], dtype=bool))
        async for _, error in self._open(self.names.llm, [stop], request_id):
            if error is not None:
                raise TritonRequestError(error.message(), request_id)
            return

    async def _end(self, call: Call, request_id: str) -> None:
        """Stops an unfinished generation, then waits for its call to end on the server's side."""
        if call.reader.done():  # the server has ended it already (an error response)
            return
        try:
            await self.stop(request_id)
            await asyncio.wait_for(asyncio.shield(call.reader), FINISH_GRACE_S)
        except (TritonRequestError, TritonUnavailable, TimeoutError):
            # The server did not end it: cancelling is the last resort, but not when the multiplexed channel broke,
            # which means the llm's process died: its calls end when the server is restarted, and a cancel that
            # meets their error responses can crash tritonserver 2.51 (see the module's docstring).
            if not call.channel_failed:
                call.cancel()

    def _open(self, model: str, inputs: list, request_id: str, late_rows: bool = False, traced: bool = True) -> Call:
        """`traced`: in the trace of the request it is opened for (not a channel that outlives it). A traced call
        carries the `traceparent` twice: as gRPC metadata, which Triton's OpenTelemetry mode continues, and as a
        request parameter, which the llm reads where Triton did not continue it (backend/llm_spans.py)."""
        headers = self._call_headers() if traced else self._headers
        parent = (headers or {}).get(tracing.TRACEPARENT) if traced else None
        request = {"model_name": model, "inputs": inputs, "request_id": request_id}
        if parent is not None:
            request["parameters"] = {tracing.TRACEPARENT: parent}

        async def one_request():
            yield request

        responses = self._client.stream_infer(one_request(), headers=headers)
        return Call(responses, self._run_in_background, late_rows)

    def _call_headers(self) -> dict[str, str] | None:
        """The metadata of a call: the API key, and while a request is traced its span's `traceparent`, which
        Triton's OpenTelemetry mode continues."""
        if tracing.endpoint() is None:
            return self._headers
        parent = tracing.traceparent()
        return {**(self._headers or {}), tracing.TRACEPARENT: parent} if parent else self._headers

    def _run_in_background(self, coroutine: Coroutine) -> asyncio.Task:
        """A task referenced until it ends: neither its caller leaving nor the garbage collector cancels it."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task
