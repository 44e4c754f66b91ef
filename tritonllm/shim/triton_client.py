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
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from tritonllm.common import errors, request_parameters
from tritonllm.formats.lora_adapters import LoraAdapter
from tritonllm.shim.direct_route import DirectRoute, Tensor
from tritonllm.shim.mux_channel import ChannelClosed, MuxChannel
from tritonllm.wire import multiplex, response_status
from tritonllm.wire.api_key import GRPC_API_KEY_HEADER
from tritonllm.wire.triton_names import REPOSITORY_NAMES, TritonNames

EMBEDDING = "embedding"
RERANKER = "reranker"
NUMPY_TYPES = {"BOOL": bool, "INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32}
FINISH_GRACE_S = 30.0  # how long an abandoned call may take to end after its stop before it is cancelled
RECONNECT_MS = 1000
# how long the last rows of a multiplexed generation may come after its own request ended (they are sent first,
# but on another stream)
LATE_ROWS_S = 30.0


class TritonRequestError(Exception):
    """Triton answered the request with an error: `typed` is the RequestError the models sent (common/errors.py),
    None for an error of another kind (a model's bug, or the server failed); `request_id`: the request's, where
    one was sent."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        self.typed = errors.from_message(message)
        self.request_id = request_id
        super().__init__(self.typed.message if self.typed else message)


class TritonUnavailable(Exception):
    """Triton could not be reached, or the connection broke: no answer came."""


@dataclass
class GenerationRequest:
    """One generation as the ensemble's tensors; None leaves a tensor out (the ensemble's default).
    The fields that tritonllm/common/request_parameters.py declares go out under their declared names and types."""

    max_tokens: int
    max_tokens_must_fit: bool | None = None  # prompt + max_tokens beyond the context: an error, not a clamp
    text: str | None = None
    prompt_ids: list[int] | None = None  # a prompt given as token ids
    messages: list[dict] | None = None
    tools: list[dict] | None = None
    # how the messages are rendered (preprocessing's inputs of the same names)
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None
    thinking_budget: int | None = None  # thinking tokens before the closing tag is forced
    thinking_open: bool | None = None  # whether the answer starts inside the thinking block
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    typical_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    watermark: bool | None = None
    stop_token_ids: list[int] | None = None
    logit_bias: dict[int, float] | None = None  # OpenAI's: token id -> bias added to its logit
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    ignore_eos: bool | None = None
    use_raw_prompt: bool | None = None
    truncate_prompt: bool | None = None
    num_samples: int = 1  # samples of the prompt (num_return_sequences)
    beam_width: int = 1  # > 1: beam search; num_samples best beams come back
    logprobs: bool | None = None
    top_logprobs: int | None = None
    prompt_logprobs: bool | None = None  # each prompt token's log-probability (completions' echo)
    guide: tuple[str, str] | None = None  # (guided_decoding_guide_type, guided_decoding_guide)
    priority: int | None = None  # 1 highest .. 5 lowest
    timeout_ms: int | None = None  # the engine ends the generation with finish reason "timeout"
    prediction: str | None = None  # Predicted Outputs: text the answer is expected to repeat
    lora: LoraAdapter | None = None  # served by its task id; with lora_weights_attached, its weights too
    lora_weights_attached: bool = False
    model: str | None = None  # the served LLM (ShimSettings.llms); None: the first
    stream: bool = True
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def num_finals(self) -> int:
        """Responses with a finish reason before the request is done: one per sample, one for all beams."""
        return 1 if self.beam_width > 1 else self.num_samples

    def inputs(self) -> list[grpcclient.InferInput]:
        return _infer_inputs(self.tensors())

    def _sent(self, name: str):
        """A field's value as sent. The llm samples only when top-k or top-p asks it to (TensorRT-LLM's rule),
        so a request that samples by its temperature alone (OpenAI's) sends the whole vocabulary's top_p."""
        if name == "top_p" and self.top_p is None and (self.temperature or 0) > 0:
            return 1.0
        return getattr(self, name)

    def tensors(self) -> list[Tensor]:
        """The ensemble's inputs."""
        tensors: list[Tensor] = [
            ("max_tokens", "INT32", np.array([[self.max_tokens]], dtype=np.int32)),
            ("stream", "BOOL", np.array([[self.stream]], dtype=bool)),
            # the API's answers never repeat the prompt (TensorRT-LLM's default would, in a whole answer)
            ("exclude_input_in_output", "BOOL", np.array([[True]], dtype=bool)),
        ]
        if self.messages is not None:
            tensors.append(("chat_messages", "BYTES", _bytes(json.dumps(self.messages))))
            if self.tools:
                tensors.append(("chat_tools", "BYTES", _bytes(json.dumps(self.tools))))
            for name in ("add_generation_prompt", "continue_final_message"):
                if getattr(self, name) is not None:
                    tensors.append((name, "BOOL", _scalar("BOOL", getattr(self, name))))
            if self.chat_template_kwargs:
                tensors.append(("chat_template_kwargs", "BYTES", _bytes(json.dumps(self.chat_template_kwargs))))
            if self.chat_template is not None:
                tensors.append(("chat_template", "BYTES", _bytes(self.chat_template)))
        elif self.prompt_ids is not None:
            tensors.append(("prompt_token_ids", "INT32", np.array([self.prompt_ids], dtype=np.int32)))
        else:
            tensors.append(("text_input", "BYTES", _bytes(self.text or "")))
        declared = [(p.ensemble_name, p.wire, self._sent(p.field)) for p in request_parameters.PARAMETERS if p.field]
        tensors += [(name, wire, _scalar(wire, value)) for name, wire, value in declared if value is not None]
        preprocessing = [
            ("ignore_eos", self.ignore_eos),
            ("use_raw_prompt", self.use_raw_prompt),
            ("truncate_prompt", self.truncate_prompt),
            ("max_tokens_must_fit", self.max_tokens_must_fit),
            ("thinking_open", self.thinking_open),
        ]
        tensors += [(name, "BOOL", _scalar("BOOL", value)) for name, value in preprocessing if value is not None]
        if self.num_samples > 1:
            tensors.append(("num_return_sequences", "INT32", _scalar("INT32", self.num_samples)))
        if self.beam_width > 1:
            tensors.append(("beam_width", "INT32", _scalar("INT32", self.beam_width)))
        if self.prediction:
            tensors.append(("prediction", "BYTES", _bytes(self.prediction)))
        if self.lora is not None:
            tensors.append(("lora_task_id", "UINT64", _scalar("UINT64", self.lora.task_id)))
            if self.lora_weights_attached:
                tensors.append(("lora_weights", "FP32", self.lora.weights[np.newaxis]))
                tensors.append(("lora_config", "INT32", self.lora.config[np.newaxis]))
        if self.stop_token_ids:
            tensors.append(("stop_token_ids", "INT32", np.array([self.stop_token_ids], dtype=np.int32)))
        if self.logit_bias:
            tensors.append(("logit_bias_ids", "INT32", np.array([list(self.logit_bias)], dtype=np.int32)))
            tensors.append(("logit_bias_values", "FP32", np.array([list(self.logit_bias.values())], dtype=np.float32)))
        if self.guide is not None:
            tensors.append(("guided_decoding_guide_type", "BYTES", _bytes(self.guide[0])))
            tensors.append(("guided_decoding_guide", "BYTES", _bytes(self.guide[1])))
        return tensors


@dataclass
class TokenizeRequest:
    """A text or chat messages for `preprocessing` alone."""

    text: str | None = None
    messages: list[dict] | None = None
    tools: list[dict] | None = None
    add_special_tokens: bool = True  # for text; a chat template adds its own
    add_generation_prompt: bool = True
    token_strs: bool = False
    model: str | None = None  # the served LLM whose tokenizer it is; None: the first

    def inputs(self) -> list[grpcclient.InferInput]:
        if self.messages is not None:
            tensors = [("chat_messages", "BYTES", _bytes(json.dumps(self.messages)))]
            if self.tools:
                tensors.append(("chat_tools", "BYTES", _bytes(json.dumps(self.tools))))
            flag = ("add_generation_prompt", self.add_generation_prompt)
        else:
            tensors = [("text_input", "BYTES", _bytes(self.text or ""))]
            flag = ("use_raw_prompt", not self.add_special_tokens)
        tensors.append((flag[0], "BOOL", np.array([[flag[1]]], dtype=bool)))
        return [_infer_input(name, dt, array) for name, dt, array in tensors]


@dataclass
class Tokenized:
    ids: list[int]
    context_len: int  # the tokens the context holds, prompt and generated
    token_strs: list[str] | None


def _whole_response(ids: list[int]) -> list[grpcclient.InferInput]:
    """`postprocessing`'s inputs for one finished sequence of `ids` with nothing before it and no log-probs."""
    fields = {name: np.zeros(1, dtype=dtype) for name, dtype in response_status.FIELDS}
    status = response_status.pack(
        {**fields, "finish_reason": np.array([b"length"]), "sequence_length": np.array([len(ids)])}
    )
    return [
        _infer_input("output_ids", "INT32", np.array([[ids]], dtype=np.int32)),
        _infer_input("preceding_ids", "INT32", np.zeros((1, 0), dtype=np.int32)),
        _infer_input(response_status.NAME, "INT64", status),
        _infer_input("check_ids", "BOOL", np.array([[True]])),
    ]


@dataclass
class TokenLogprob:
    token: str
    logprob: float | None  # None: the prompt's first token, which nothing predicts
    top: list[tuple[str, float]]  # the best alternatives, best first
    token_id: int | None = None  # where known: the token's id, and its alternatives'
    top_ids: list[int] = field(default_factory=list)

    def as_token_ids(self) -> TokenLogprob:
        """vLLM's return_tokens_as_token_ids: each token named `token_id:<id>`, as text may not tell them apart."""
        named = [(f"token_id:{i}", lp) for i, (_, lp) in zip(self.top_ids, self.top, strict=True)]
        return dataclasses.replace(self, token=f"token_id:{self.token_id}", top=named)


@dataclass
class Chunk:
    """One ensemble response: the new text of one sample (or every beam's whole text), and its counters."""

    texts: list[str]  # one per beam; a sample's is texts[0]
    finish_reason: str  # "" until the sample's last chunk
    index: int  # which sample
    num_input_tokens: int
    num_output_tokens: int
    batch_size: int
    queue_wait_us: int
    num_tokens: int  # tokens in this chunk
    stop_token: int  # the stop_token_ids entry that ended it, else -1
    accepted_prediction_tokens: int  # with a prediction: its tokens kept as drafts so far, and the rest of them
    rejected_prediction_tokens: int
    logprobs: list[TokenLogprob]
    arrived: float  # time.monotonic()
    token_texts: list[str] = field(default_factory=list)  # each new token's own text (decoded alone)
    # asked for by return_prompt_log_probs, in a sample's first chunk: the prompt as text, and its tokens' log-probs
    prompt_text: str | None = None
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # the first one's logprob is None

    @property
    def text(self) -> str:
        return self.texts[0]

    @classmethod
    def from_outputs(cls, output: Callable[[str], np.ndarray | None]) -> Chunk:
        """From the ensemble's outputs, each read by name with `output` (None for one the response left out:
        postprocess.CONDITIONAL)."""

        def scalar(name: str, missing=None):
            value = output(name)
            return missing if value is None else value.reshape(-1)[0]

        def strings(name: str) -> list[str]:
            return [b.decode("utf-8", "replace") for b in output(name).reshape(-1)]

        tokens = strings("token_texts")
        ids = output("output_ids").reshape(-1).tolist()
        return cls(
            texts=[b.decode("utf-8") for b in output("text_output").reshape(-1)],
            finish_reason=scalar("finish_reason").decode(),
            index=int(scalar("sequence_index")),
            num_input_tokens=int(scalar("num_input_tokens")),
            num_output_tokens=int(scalar("num_output_tokens")),
            batch_size=int(scalar("batch_size")),
            queue_wait_us=int(scalar("queue_wait_us")),
            num_tokens=len(ids),
            stop_token=int(scalar("stop_token", -1)),
            accepted_prediction_tokens=int(scalar("accepted_prediction_tokens", 0)),
            rejected_prediction_tokens=int(scalar("rejected_prediction_tokens", 0)),
            logprobs=_token_log_probs(output, tokens, ids),
            arrived=time.monotonic(),
            token_texts=tokens,
            **_prompt_log_probs(scalar("prompt_log_probs_json", b"")),
        )


def _token_log_probs(output: Callable[[str], np.ndarray | None], tokens: list[str], ids: list[int]) -> list:
    """Each token's TokenLogprob, where the response carries log-probs."""
    sent = output("output_log_probs")  # tritonclient's as_numpy decodes the tensor at each call: once here
    if sent is None:
        return []
    log_probs = sent.reshape(-1).tolist()
    top, top_texts, top_ids = output("top_log_probs")[0], output("top_token_texts")[0], output("top_token_ids")[0]
    return [
        TokenLogprob(
            tokens[i],
            log_probs[i],
            [(t.decode("utf-8", "replace"), float(v)) for t, v in zip(top_texts[i], top[i], strict=True)]
            if i < len(top)
            else [],
            ids[i],
            top_ids[i].tolist() if i < len(top_ids) else [],
        )
        for i in range(len(log_probs))
    ]


def _prompt_log_probs(raw: bytes) -> dict:
    """Chunk's prompt fields from postprocessing's JSON (b"" where a response has none: all but the first)."""
    if not raw:
        return {}
    parsed = json.loads(raw)
    tokens = [
        TokenLogprob(
            t["token"], t["logprob"], [(text, lp) for text, lp, _ in t["top"]], t["id"], [i for *_, i in t["top"]]
        )
        for t in parsed["tokens"]
    ]
    return {"prompt_text": parsed["text"], "prompt_logprobs": tokens}


def _ensemble_chunk(result) -> Chunk:
    return Chunk.from_outputs(result.as_numpy)


def _all_outputs(result) -> dict[str, np.ndarray]:
    return {output.name: result.as_numpy(output.name) for output in result.get_response().outputs}


def _output(result, name: str) -> Tensor:
    return name, result.get_output(name).datatype, result.as_numpy(name)


def _string(result, name: str) -> str:
    return result.as_numpy(name).reshape(-1)[0].decode("utf-8")


def _scalar(wire: str, value) -> np.ndarray:
    return np.array([[value]], dtype=NUMPY_TYPES[wire])


def _text_rows(texts: list[str]) -> np.ndarray:
    """[rows, 1] BYTES, a text a row (a batched model's input)."""
    return np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)


def _bytes(text: str) -> np.ndarray:
    return np.array([[text.encode("utf-8")]], dtype=np.object_)


def _lora_not_held(error: TritonRequestError) -> bool:
    """An error naming the task id: the llm does not hold the adapter (or serves no LoRA at all, which the resend
    with the weights then answers with the same error)."""
    return error.typed is not None and error.typed.param == "lora_task_id"


def _infer_input(name: str, datatype: str, array: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _infer_inputs(tensors: list[Tensor]) -> list[grpcclient.InferInput]:
    return [_infer_input(name, dt, array) for name, dt, array in tensors]


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

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """Yields chunks until the one with a finish reason; ends the generation if the caller stops early. A
        LoRA adapter the llm does not hold (never sent to it, or forgotten for newer ones) is sent once more with
        its weights, under a new request id (the first one's stop may still be on its way)."""
        try:
            async with contextlib.aclosing(self._generate(request)) as chunks:
                async for chunk in chunks:
                    yield chunk
            return
        except TritonRequestError as e:
            if request.lora is None or request.lora_weights_attached or not _lora_not_held(e):
                raise
        retry = dataclasses.replace(request, lora_weights_attached=True, request_id=uuid.uuid4().hex)
        async with contextlib.aclosing(self._generate(retry)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        route, mux = await self.direct_route(), None
        if route is None:
            call = self._open(self.names.ensemble, request.inputs(), request.request_id)
            to_chunk = _ensemble_chunk
        else:
            tensors = request.tensors()
            wanted = list(route.preprocessing_outputs)
            preprocessed = await self._infer(
                self.names.preprocessing, _infer_inputs(route.preprocessing_request(tensors)), wanted
            )
            llm_inputs = route.llm_request(tensors, [_output(preprocessed, name) for name in wanted])
            mux = await self._mux_channel()
            if mux is not None:
                llm_inputs.append((multiplex.CHANNEL, "BYTES", _bytes(mux.id)))
            call = self._open(self.names.llm, _infer_inputs(llm_inputs), request.request_id, late_rows=mux is not None)
            if mux is not None:
                mux.listen(request.request_id, call.deliver)
                mux.hold(call.reader)

            def to_chunk(result) -> Chunk:
                outputs = result.arrays if isinstance(result, multiplex.Row) else _all_outputs(result)
                return Chunk.from_outputs(route.outputs(outputs).get)

        done, finals = False, 0
        try:
            async for result, error in call:
                if error is not None:
                    raise TritonRequestError(error.message(), request.request_id)
                if not isinstance(result, multiplex.Row) and not result.get_response().outputs:
                    continue  # a multiplexed generation's own FINAL response
                chunk = to_chunk(result)
                finals += bool(chunk.finish_reason)
                done = finals == request.num_finals
                yield chunk
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
                    self.names.preprocessing, [_infer_input("text_input", "BYTES", _bytes(""))], ["tokenizer_snapshot"]
                )
                self._route = DirectRoute.of(config.config, _string(snapshot, "tokenizer_snapshot"), self.names)
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
                    self.names.llm, [_infer_input(multiplex.OPEN, "BOOL", np.array([[True]]))], channel_id
                )
                channel = MuxChannel(channel_id, opening, _all_outputs)
                opened = await channel.open()
                self._mux_refused = channel.refusal is not None
                self._mux = channel if opened else None
        return self._mux if self._mux is not None and not self._mux.closed else None

    async def embed(self, texts: list[str], instruction: str | None) -> tuple[np.ndarray, np.ndarray]:
        """Each text's vector [rows, dimension] and token count [rows] from the `embedding` model."""
        rows = _text_rows(texts)
        inputs = [_infer_input("text_input", "BYTES", rows)]
        if instruction:
            inputs.append(_infer_input("instruction", "BYTES", np.full_like(rows, instruction.encode("utf-8"))))
        result = await self._infer(EMBEDDING, inputs)
        return result.as_numpy("embedding"), result.as_numpy("num_input_tokens").reshape(-1)

    async def score(self, queries: list[str], documents: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each (query, document) pair's relevance [rows] and token count [rows] from the `reranker` model."""
        inputs = [
            _infer_input("query", "BYTES", _text_rows(queries)),
            _infer_input("document", "BYTES", _text_rows(documents)),
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
        result = await self._infer(self.names.postprocessing, _whole_response(ids), ["text_output"])
        return result.as_numpy("text_output").reshape(-1)[0].decode("utf-8")

    async def tokenizer_info(self) -> dict:
        """The tokenizer's special tokens, chat template and context, from `preprocessing`."""
        # Triton takes no request without an input; preprocessing reads none when asked for this alone
        result = await self._infer(
            self.names.preprocessing, [_infer_input("text_input", "BYTES", _bytes(""))], ["tokenizer_info"]
        )
        return json.loads(_string(result, "tokenizer_info"))

    async def _infer(self, model: str, inputs: list, outputs: list[str] | None = None):
        """One request, one response; shielded, so that a caller going away does not cancel the call."""
        wanted = [grpcclient.InferRequestedOutput(name) for name in outputs] if outputs else None
        call = self._run_in_background(self._client.infer(model, inputs, outputs=wanted, headers=self._headers))
        try:
            return await asyncio.shield(call)
        except InferenceServerException as e:
            if e.status() == str(grpc.StatusCode.UNAVAILABLE):
                raise TritonUnavailable(e.message()) from e
            raise TritonRequestError(e.message()) from e

    async def stop(self, request_id: str) -> None:
        """Ends the llm sequences that carry `request_id`."""
        stop = _infer_input("stop", "BOOL", np.array([[True]], dtype=bool))
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

    def _open(self, model: str, inputs: list, request_id: str, late_rows: bool = False) -> Call:
        async def one_request():
            yield {"model_name": model, "inputs": inputs, "request_id": request_id}

        responses = self._client.stream_infer(one_request(), headers=self._headers)
        return Call(responses, self._run_in_background, late_rows)

    def _run_in_background(self, coroutine: Coroutine) -> asyncio.Task:
        """A task referenced until it ends: neither its caller leaving nor the garbage collector cancels it."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task


class Call:
    """The responses of one gRPC stream, read to the stream's end by a task of its own.

    grpc.aio cancels a call whose reader is cancelled (a caller that goes away), or that is collected unfinished
    (a reader that stops at the final response, before the server has closed the stream). Read by a task of its
    own, the call ends only when the server ends it. Iterating yields (result, error) pairs, and raises
    TritonUnavailable if the connection fails.
    """

    _END = object()

    def __init__(self, responses, run: Callable[[Coroutine], asyncio.Task], late_rows: bool = False) -> None:
        """`late_rows`: responses may also come from a multiplexed channel (`deliver`), after the stream ended."""
        self._responses = responses
        self._queue: asyncio.Queue = asyncio.Queue()
        self._late_rows = late_rows
        self._stream_ended = False
        self.channel_failed = False  # the multiplexed channel ended before this generation did
        self.reader = run(self._read())

    def deliver(self, item: multiplex.Row | ChannelClosed) -> None:
        self.channel_failed = self.channel_failed or isinstance(item, ChannelClosed)
        self._queue.put_nowait(item if isinstance(item, ChannelClosed) else (item, None))

    async def _read(self) -> None:
        try:
            async for item in self._responses:
                self._queue.put_nowait(item)
        except grpc.RpcError as e:
            self._queue.put_nowait(TritonUnavailable(f"Triton stream failed: {e.code().name}: {e.details()}"))
        finally:
            self._queue.put_nowait(self._END)

    def cancel(self) -> None:
        self._responses.cancel()

    def __aiter__(self) -> Call:
        return self

    async def __anext__(self) -> tuple:
        while True:
            if self._stream_ended:
                try:
                    item = await asyncio.wait_for(self._queue.get(), LATE_ROWS_S)
                except TimeoutError:
                    raise TritonUnavailable("the llm ended the request, but not all its responses came") from None
            else:
                item = await self._queue.get()
            if item is not self._END:
                break
            if not self._late_rows:
                self._queue.put_nowait(item)  # every later read ends too
                raise StopAsyncIteration
            self._stream_ended = True
        if isinstance(item, TritonUnavailable):
            raise item
        if isinstance(item, ChannelClosed):
            raise TritonUnavailable(f"Triton stream failed: {item}")
        return item
