"""The shim's requests as Triton tensors: a generation as the ensemble's inputs (and the llm's, on the direct
route), a tokenization as preprocessing's, a finished sequence as postprocessing's."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcclient

from tritonllm.common import request_parameters
from tritonllm.formats.lora_adapters import LoraAdapter
from tritonllm.shim.direct_route import Tensor
from tritonllm.wire import response_status

NUMPY_TYPES = {"BOOL": bool, "INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32}


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
    add_special_tokens: bool | None = None  # the tokenizer's special tokens on top of the template's
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
    truncate_prompt_tokens: int | None = None  # vLLM's: the prompt's last (or first) so many tokens; -1: what fits
    truncation_side: str | None = None  # "left" (the default) keeps the last tokens, "right" the first
    num_samples: int = 1  # samples of the prompt (num_return_sequences)
    beam_width: int = 1  # > 1: beam search; num_samples best beams come back
    logprobs: bool | None = None
    top_logprobs: int | None = None
    prompt_logprobs: bool | None = None  # each prompt token's log-probability (completions' echo)
    prompt_ids_returned: bool | None = None  # the prompt's ids in a sample's first response
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
        return infer_inputs(self.tensors())

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
            tensors.append(("chat_messages", "BYTES", bytes_tensor(json.dumps(self.messages))))
            if self.tools:
                tensors.append(("chat_tools", "BYTES", bytes_tensor(json.dumps(self.tools))))
            for name in ("add_generation_prompt", "continue_final_message", "add_special_tokens"):
                if getattr(self, name) is not None:
                    tensors.append((name, "BOOL", _scalar("BOOL", getattr(self, name))))
            if self.chat_template_kwargs:
                tensors.append(("chat_template_kwargs", "BYTES", bytes_tensor(json.dumps(self.chat_template_kwargs))))
            if self.chat_template is not None:
                tensors.append(("chat_template", "BYTES", bytes_tensor(self.chat_template)))
        elif self.prompt_ids is not None:
            tensors.append(("prompt_token_ids", "INT32", np.array([self.prompt_ids], dtype=np.int32)))
        else:
            tensors.append(("text_input", "BYTES", bytes_tensor(self.text or "")))
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
        if self.truncate_prompt_tokens is not None:
            tensors.append(("truncate_prompt_tokens", "INT32", _scalar("INT32", self.truncate_prompt_tokens)))
            if self.truncation_side is not None:
                tensors.append(("truncation_side", "BYTES", bytes_tensor(self.truncation_side)))
        if self.prediction:
            tensors.append(("prediction", "BYTES", bytes_tensor(self.prediction)))
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
            tensors.append(("guided_decoding_guide_type", "BYTES", bytes_tensor(self.guide[0])))
            tensors.append(("guided_decoding_guide", "BYTES", bytes_tensor(self.guide[1])))
        return tensors


@dataclass
class TokenizeRequest:
    """A text or chat messages for `preprocessing` alone."""

    text: str | None = None
    messages: list[dict] | None = None
    tools: list[dict] | None = None
    add_special_tokens: bool = True  # for a chat, the tokenizer's own on top of what its template writes
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    token_strs: bool = False
    model: str | None = None  # the served LLM whose tokenizer it is; None: the first

    def inputs(self) -> list[grpcclient.InferInput]:
        if self.messages is not None:
            tensors = [("chat_messages", "BYTES", bytes_tensor(json.dumps(self.messages)))]
            if self.tools:
                tensors.append(("chat_tools", "BYTES", bytes_tensor(json.dumps(self.tools))))
            flags = {
                "add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message,
                "add_special_tokens": self.add_special_tokens,
            }
        else:
            tensors = [("text_input", "BYTES", bytes_tensor(self.text or ""))]
            flags = {"use_raw_prompt": not self.add_special_tokens}
        tensors += [(name, "BOOL", np.array([[value]], dtype=bool)) for name, value in flags.items()]
        return [infer_input(name, dt, array) for name, dt, array in tensors]


@dataclass
class Tokenized:
    ids: list[int]
    context_len: int  # the tokens the context holds, prompt and generated
    token_strs: list[str] | None


def whole_response_inputs(ids: list[int]) -> list[grpcclient.InferInput]:
    """`postprocessing`'s inputs for one finished sequence of `ids` with nothing before it and no log-probs."""
    fields = {name: np.zeros(1, dtype=dtype) for name, dtype in response_status.FIELDS}
    status = response_status.pack(
        {**fields, "finish_reason": np.array([b"length"]), "sequence_length": np.array([len(ids)])}
    )
    return [
        infer_input("output_ids", "INT32", np.array([[ids]], dtype=np.int32)),
        infer_input("preceding_ids", "INT32", np.zeros((1, 0), dtype=np.int32)),
        infer_input(response_status.NAME, "INT64", status),
        infer_input("check_ids", "BOOL", np.array([[True]])),
    ]


def _scalar(wire: str, value) -> np.ndarray:
    return np.array([[value]], dtype=NUMPY_TYPES[wire])


def text_rows(texts: list[str]) -> np.ndarray:
    """[rows, 1] BYTES, a text a row (a batched model's input)."""
    return np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)


def bytes_tensor(text: str) -> np.ndarray:
    return np.array([[text.encode("utf-8")]], dtype=np.object_)


def infer_input(name: str, datatype: str, array: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def infer_inputs(tensors: list[Tensor]) -> list[grpcclient.InferInput]:
    return [infer_input(name, dt, array) for name, dt, array in tensors]
