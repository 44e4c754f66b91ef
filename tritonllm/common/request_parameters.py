"""The request parameters that travel from the ensemble to `llm` as they are: one declaration each.

A declaration gives the `llm` tensor (TensorRT-LLM's InferenceRequest name), its Triton type, the value the
engine uses when the tensor is absent, the rule a value must meet, the ensemble's name for it when that differs,
and the `GenerationRequest` field the shim sends it from. Everything else is built from here:

- the engine reads and checks each one with `read` (tritonllm/engine/state/inference_request.py);
- the inputs of `llm/config.pbtxt` and `ensemble/config.pbtxt` and the ensemble's map between them are
  generated sections (`make configs` writes them, tests/unit/test_request_parameters.py fails when they drift);
- the shim's `GenerationRequest.inputs()` sends every declared field under its ensemble name and type;
- the table in docs/tensors.md.

Adding a sampling parameter: declare it here, use it in the engine (SamplingParams, the sampler), run
`make configs`. To offer it over HTTP too, give it a `GenerationRequest` field and set that from the API body.
Tensors that preprocessing makes (input_ids, request_output_len, end_id, the word lists), and arrays, are not
declared here: their shapes and meaning need code of their own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tritonllm.common.errors import RequestError

UINT64_MAX = (1 << 64) - 1
INT32_MAX = (1 << 31) - 1
MAX_BEAM_WIDTH = 16
MAX_SAMPLES = 64
MAX_TOP_LOG_PROBS = 20
HIGHEST_PRIORITY, LOWEST_PRIORITY = 1, 5
DEFAULT_PRIORITY = LOWEST_PRIORITY  # as the generate_stream spec
BACKGROUND_PRIORITY = LOWEST_PRIORITY + 1  # below every client's request: the Batch API's lines
# early_stopping values -> transformers' setting (see engine/decoding/beam_search.py)
EARLY_STOPPING = {1: True, 0: False, -1: "never"}

WIRE_TYPES = {"BOOL": bool, "INT32": int, "UINT64": int, "FP32": float, "BYTES": str}


@dataclass(frozen=True)
class Rule:
    """What a value must be: `text` for the error message, `holds` to test it."""

    text: str
    holds: Callable[[Any], bool]


def at_least(low: float) -> Rule:
    return Rule(f">= {low}", lambda v: v >= low)


def above(low: float) -> Rule:
    return Rule(f"> {low}", lambda v: v > low)


def within(low: float, high: float, low_open: bool = False, note: str = "") -> Rule:
    text = f"in {'(' if low_open else '['}{low}, {high}]" + (f" ({note})" if note else "")
    return Rule(text, lambda v: (v > low if low_open else v >= low) and v <= high)


FINITE = Rule("finite", lambda v: math.isfinite(v))
UINT64 = Rule("a uint64", lambda v: 0 <= v <= UINT64_MAX)
ANY = Rule("", lambda v: True)


@dataclass(frozen=True)
class Parameter:
    name: str  # the llm's input tensor
    wire: str  # its Triton data type: BOOL, INT32, UINT64, FP32 or BYTES
    doc: str  # one line: what it does (the configs' comment, the docs' table)
    default: Any = None  # the engine's value when the tensor is absent; None: absent means "not set"
    rule: Rule = ANY
    ensemble: str = ""  # the ensemble's input name, when it is not `name`
    field: str = ""  # the shim's GenerationRequest field that sends it; "" when the shim sends it otherwise

    @property
    def ensemble_name(self) -> str:
        return self.ensemble or self.name


# fmt: off
PARAMETERS: tuple[Parameter, ...] = (
    Parameter("streaming", "BOOL", "one response per new token (or per stream_interval); else one at the end",
              False, ensemble="stream"),
    Parameter("stream_interval", "INT32", "a streamed response every N new tokens (the first and the last at "
              "once); default: the model's stream_interval parameter", None, at_least(1)),
    Parameter("temperature", "FP32", "scales the logits when sampling; 0 decodes greedily. As in TensorRT-LLM, a "
              "request samples only when it sets runtime_top_k > 1, runtime_top_p > 0, typical_p < 1 or min_p > 0; "
              "otherwise it decodes greedily whatever its temperature", None, at_least(0), field="temperature"),
    Parameter("runtime_top_k", "INT32", "sample among the k most likely tokens; 0: all", None, at_least(0),
              ensemble="top_k", field="top_k"),
    Parameter("runtime_top_p", "FP32", "nucleus sampling; <= 0 means unset, as in TensorRT-LLM", None,
              Rule("<= 1", lambda v: v <= 1), ensemble="top_p", field="top_p"),
    Parameter("typical_p", "FP32", "typical-p sampling (transformers' TypicalLogitsWarper)", 1.0,
              within(0, 1, low_open=True), field="typical_p"),
    Parameter("min_p", "FP32", "keeps the tokens at least min_p times as likely as the likeliest (transformers' "
              "MinPLogitsWarper, vLLM's min_p)", 0.0, within(0, 1), field="min_p"),
    Parameter("random_seed", "UINT64", "seeds the request's own generator: the same seed gives the same tokens "
              "whatever else is in the batch", None, UINT64, field="seed"),
    Parameter("seed", "UINT64", "random_seed's newer TensorRT-LLM name (give one of them)", None, UINT64),
    Parameter("watermark", "BOOL", "Kirchenbauer et al.'s watermark, as transformers' WatermarkLogitsProcessor "
              "with its defaults", False, field="watermark"),
    Parameter("repetition_penalty", "FP32", "over prompt and output tokens, as transformers", 1.0, above(0),
              field="repetition_penalty"),
    Parameter("presence_penalty", "FP32", "over output tokens, as OpenAI and vLLM", 0.0, FINITE,
              field="presence_penalty"),
    Parameter("frequency_penalty", "FP32", "over output tokens, as OpenAI and vLLM", 0.0, FINITE,
              field="frequency_penalty"),
    Parameter("min_length", "INT32", "output tokens before end_id may end the generation", 0, at_least(0)),
    Parameter("min_tokens", "INT32", "min_length's newer TensorRT-LLM name (give one of them)", 0, at_least(0),
              field="min_tokens"),
    Parameter("thinking_budget", "INT32", "a reasoning model's thinking tokens before its closing tag "
              "(thinking_end_ids) is forced and the answer follows; default: no limit", None, at_least(0),
              field="thinking_budget"),
    Parameter("no_repeat_ngram_size", "INT32", "no n-gram of this size occurs twice", 0, at_least(0)),
    Parameter("beam_width", "INT32", "beam search (deterministic): the best beams come whole in one final "
              "response, padded with pad_id", 1, within(1, MAX_BEAM_WIDTH)),
    Parameter("len_penalty", "FP32", "beam score = sum of log-probs / length ** len_penalty", 1.0, FINITE,
              ensemble="length_penalty"),
    Parameter("early_stopping", "INT32", "1: stop once beam_width beams ended; 0: when no live beam can win "
              "(transformers' heuristic); -1: never", 1, Rule("1 (true), 0 (false) or -1 (never)",
              lambda v: v in EARLY_STOPPING)),
    Parameter("num_return_sequences", "INT32", "samples of one prompt, sharing its KV blocks (sample i draws "
              "from random_seed + i); with beam_width, how many of the best beams (default: all)", None,
              within(1, MAX_SAMPLES)),
    Parameter("return_log_probs", "BOOL", "log-softmax of the unprocessed logits of each output token", False,
              field="logprobs"),
    Parameter("num_top_log_probs", "INT32", "alternatives per token, with their log-probabilities", 0,
              within(0, MAX_TOP_LOG_PROBS), field="top_logprobs"),
    Parameter("return_prompt_log_probs", "BOOL", "each prompt token's log-probability given the tokens before "
              "it, its rank among the vocabulary (and num_top_log_probs alternatives)", False,
              field="prompt_logprobs"),
    Parameter("return_prompt_ids", "BOOL", "the prompt's token ids as the engine runs them, in a sample's first "
              "response (vLLM's return_token_ids)", False, field="prompt_ids_returned"),
    Parameter("return_context_logits", "BOOL", "the prompt's logits, in the last response (TensorRT-LLM's)", False),
    Parameter("return_generation_logits", "BOOL", "each output token's logits", False),
    Parameter("guided_decoding_guide_type", "BYTES", "grammar-constrained decoding (llguidance): json, "
              "json_schema, regex or lark"),
    Parameter("guided_decoding_guide", "BYTES", "the guide's text: a schema, an expression or a grammar"),
    Parameter("include_stop_words_in_output", "BOOL", "false: a stop word that ends the generation is left out "
              "of the final response", True, ensemble="include_stop_str_in_output",
              field="include_stop_str_in_output"),
    Parameter("skip_special_tokens", "BOOL", "handed through to the detokenizer (postprocessing)", True,
              field="skip_special_tokens"),
    Parameter("priority", "INT32", "admission order, and who is preempted first", DEFAULT_PRIORITY,
              within(HIGHEST_PRIORITY, BACKGROUND_PRIORITY, note="1 highest; 6 background"), field="priority"),
    Parameter("timeout_ms", "INT32", "the request ends with finish_reason timeout this long after it arrived "
              "(else at Triton's request timeout)", None, above(0), field="timeout_ms"),
    Parameter("prompt_vocab_size", "INT32", "p-tuning: the rows of prompt_embedding_table in use (default: "
              "all)", None, above(0)),
)
# fmt: on

BY_NAME = {p.name: p for p in PARAMETERS}

TensorLookup = Callable[[str], Any]  # an input's numpy array by name, None when absent


def scalar(get: TensorLookup, name: str, default=None):
    """A one-value tensor's value (strings as bytes), `default` when the tensor is absent."""
    array = get(name)
    if array is None:
        return default
    if array.size != 1:
        raise RequestError(name, f"{name} must hold exactly one value, got shape {list(array.shape)}")
    value = array.reshape(-1)[0]
    return value.item() if isinstance(value, np.generic) else value


def read(get: TensorLookup, name: str) -> Any:
    """The request's value of a declared parameter, as a Python value of its type, checked against its rule;
    its default when the tensor is absent. Errors name the tensor."""
    parameter = BY_NAME[name]
    raw = scalar(get, name)
    if raw is None:
        return parameter.default
    value = raw.decode() if isinstance(raw, bytes) else WIRE_TYPES[parameter.wire](raw)
    if not parameter.rule.holds(value):
        raise RequestError(name, f"{name} must be {parameter.rule.text}, got {value}")
    return value


def batch_rows(inputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """TensorRT-LLM's batch in one request -> each row's tensors: `input_ids` [B, n] with `input_lengths` [B, 1]
    is B prompts, each its row up to its length (utils.cc splitBatchInputsTensors); every other tensor gives each
    row its own. One row comes back as it is."""
    ids = inputs.get("input_ids")
    batch = 1 if ids is None or ids.ndim < 2 else ids.shape[0]
    if batch == 1:
        return [inputs]
    lengths = inputs.get("input_lengths")
    if lengths is None or lengths.size != batch:
        raise RequestError("input_lengths", f"input_lengths must give each of the {batch} rows of input_ids its length")
    rows = []
    for b, length in enumerate(lengths.reshape(-1).tolist()):
        if not 1 <= length <= ids.shape[1]:
            raise RequestError("input_lengths", f"input_lengths[{b}] must be in [1, {ids.shape[1]}], got {length}")
        row = {name: array[b : b + 1] for name, array in inputs.items() if name != "input_lengths"}
        row["input_ids"] = ids[b : b + 1, :length]
        rows.append(row)
    return rows
