"""TensorRT-LLM's ids-level model, `tensorrt_llm`, as a face over the engine's model `llm`.

Clients written for tensorrtllm_backend (its inflight_batcher_llm client, benchmark_core_model, end_to_end_test)
call `tensorrt_llm` with its tensors and read its answers by its rules. The engine's own model `llm` keeps the
contract the shim and the ensemble build on; this module turns one into the other, without Triton so it is
tested directly (model_repository/tensorrt_llm/1/model.py relays the requests). What differs, each as
tensorrtllm_backend's `inflight_batcher_llm/src` does it:

- a batch: `input_ids` [B, n] with `input_lengths` [B, 1] is B generations, each its row up to its length;
  each response names its row in `batch_index` (B > 1 needs the decoupled policy, as there);
- `early_stopping` is BOOL and `lora_weights` FP16 in its config (the engine's are INT32 and FP32);
- `exclude_input_in_output` absent: the model's parameter of that name (TensorRT-LLM's default false: a
  non-streaming `output_ids` starts with the prompt, and `sequence_length` counts it);
- the end token is neither returned nor counted;
- streaming is refused by a model deployed without the decoupled policy, with TensorRT-LLM's message.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tritonllm.common.errors import RequestError
from tritonllm.common.request_parameters import batch_rows, scalar
from tritonllm.wire import response_status

# tensorrtllm_backend's preprocessing and postprocessing, called on their own (its end_to_end_test does): their
# input names -> ours, and the outputs its clients read
PREPROCESSING_INPUTS = {
    "QUERY": "text_input",
    "REQUEST_OUTPUT_LEN": "max_tokens",
    "BAD_WORDS_DICT": "bad_words",
    "STOP_WORDS_DICT": "stop_words",
    "EMBEDDING_BIAS_WORDS": "embedding_bias_words",
    "EMBEDDING_BIAS_WEIGHTS": "embedding_bias_weights",
    "END_ID": "end_id",
    "PAD_ID": "pad_id",
}
PREPROCESSING_OUTPUTS = {  # theirs -> ours (None: made from the prompt's length or the pad id)
    "INPUT_ID": "input_ids",
    "REQUEST_INPUT_LEN": None,
    "DECODER_INPUT_ID": None,
    "REQUEST_DECODER_INPUT_LEN": None,
    "BAD_WORDS_IDS": "bad_words_list",
    "STOP_WORDS_IDS": "stop_words_list",
    "EMBEDDING_BIAS": "embedding_bias",
    "REQUEST_OUTPUT_LEN": "request_output_len",
    "OUT_END_ID": "end_id",
    "OUT_PAD_ID": "pad_id",
}


def split_rows(inputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """A request's inputs, each [B, ...] -> each prompt's, [1, ...] (Triton gives every input the same B)."""
    batch = next(iter(inputs.values())).shape[0] if inputs else 1
    return [{name: array[b : b + 1] for name, array in inputs.items()} for b in range(batch)] if batch > 1 else [inputs]


# preprocessing's outputs that are lists of ids per prompt: padded to the longest, as TensorRT-LLM pads a batch
WORD_LISTS = ("bad_words_list", "stop_words_list")
ONE_PROMPT_ONLY = (
    "prediction_ids",
    "thinking_start_ids",
    "thinking_end_ids",
    "token_strs",
    "multimodal_embeddings",
    "mrope_positions",
)


def stacked(rows: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Each prompt's preprocessing outputs ([1, ...]) -> the batch's ([B, ...]): input_ids padded with each
    row's pad id after its input_lengths, word lists with -1, a missing embedding bias as zeros."""
    out = {}
    for name in rows[0]:
        arrays = [row[name] for row in rows]
        if name in ONE_PROMPT_ONLY and any(a.size for a in arrays):
            raise RequestError(name.removesuffix("_ids"), f"{name.removesuffix('_ids')} takes one prompt a request")
        width = max(a.shape[-1] for a in arrays)
        if name == "input_ids":
            pads = [int(row["pad_id"].reshape(-1)[0]) for row in rows]
            arrays = [
                np.pad(a, ((0, 0), (0, width - a.shape[-1])), constant_values=max(p, 0))
                for a, p in zip(arrays, pads, strict=True)
            ]
        elif name in WORD_LISTS:
            arrays = [np.pad(a, ((0, 0), (0, 0), (0, width - a.shape[-1])), constant_values=-1) for a in arrays]
        elif name == "embedding_bias":
            arrays = [a if a.shape[-1] == width else np.zeros((1, width), dtype=np.float32) for a in arrays]
        out[name] = np.concatenate(arrays)
    return out


def preprocessing_outputs(ours: dict[str, np.ndarray], wanted: set[str]) -> dict[str, np.ndarray]:
    """The outputs under tensorrtllm_backend's preprocessing names that a request asked for, from ours. A
    decoder-only model's decoder prompt is its pad id alone, as there."""
    made = {
        "REQUEST_INPUT_LEN": ours["input_lengths"],
        "DECODER_INPUT_ID": ours["pad_id"].astype(np.int32),
        "REQUEST_DECODER_INPUT_LEN": np.ones_like(ours["pad_id"], dtype=np.int32),
    }
    return {
        theirs: made[theirs] if name is None else ours[name]
        for theirs, name in PREPROCESSING_OUTPUTS.items()
        if theirs in wanted
    }


def postprocessing_output(decode, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """tensorrtllm_backend's postprocessing: TOKENS_BATCH [1, beams, n] cut to SEQUENCE_LENGTH [1, beams] ->
    OUTPUT, each beam's text with special tokens skipped, [beams]."""
    beams = tokens.reshape(-1, tokens.shape[-1])
    texts = [decode(beam[:n].tolist()) for beam, n in zip(beams, lengths.reshape(-1).tolist(), strict=True)]
    return np.array([t.encode() for t in texts], dtype=np.object_)


# decoder-only models ignore an encoder-decoder's decoder prompt, as TensorRT-LLM's do
IGNORED = ("decoder_input_ids",)
# The outputs a relay needs of every llm response, whether or not its client asked for them.
RELAY_OUTPUTS = ("output_ids", "sequence_length", "finish_reason")
STREAMING_NEEDS_DECOUPLED = "Streaming is only supported if model is deployed using decoupled mode."
BATCH_NEEDS_DECOUPLED = "Batch size > 1 requires the tensorrt_llm backend to be using decoupled transaction policy"


def generations(inputs: dict[str, np.ndarray], exclude_input_default: bool, decoupled: bool) -> list[dict]:
    """A request's tensors -> the llm's tensors of each generation in it, in batch order."""
    ids = inputs.get("input_ids")
    batch = 1 if ids is None or ids.ndim < 2 else ids.shape[0]
    if not decoupled:  # in utils.cc's order: the batch, then streaming
        if batch > 1:
            raise RequestError("input_ids", BATCH_NEEDS_DECOUPLED)
        if scalar(inputs.get, "streaming", False):
            raise RequestError("streaming", STREAMING_NEEDS_DECOUPLED)
        if scalar(inputs.get, "num_return_sequences", 1) > 1 and scalar(inputs.get, "beam_width", 1) == 1:
            raise RequestError(
                "num_return_sequences", "num_return_sequences > 1 answers once a sample: it needs decoupled mode"
            )
    converted = {name: array for name, array in inputs.items() if name not in IGNORED}
    if "early_stopping" in converted:  # TensorRT-LLM's BOOL: true stops once beam_width beams ended
        converted["early_stopping"] = converted["early_stopping"].astype(np.int32)
    if "lora_weights" in converted:
        converted["lora_weights"] = converted["lora_weights"].astype(np.float32)
    if "exclude_input_in_output" not in converted:
        converted["exclude_input_in_output"] = np.full((batch, 1), exclude_input_default, dtype=bool)
    return batch_rows(converted)


@dataclass
class Generation:
    """One generation's llm responses -> TensorRT-LLM's. `end_id`: its end token (None: it has none)."""

    wanted: frozenset[str]  # the outputs its client asked for (all, when it named none)
    end_id: int | None
    batch_index: int | None  # its row, when the request held several
    samples: int  # responses with a finish reason before it is done: its samples, or one for all beams
    finished_samples: int = 0

    def response(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The client's response for one llm response (its last: `done` turns true)."""
        arrays = dict(arrays)
        ended = bool(arrays["finish_reason"].reshape(-1)[0])
        if ended:
            self.finished_samples += 1
            if self.end_id is not None and arrays["finish_reason"].reshape(-1)[0] == b"end_id":
                _drop_end_token(arrays, self.end_id)
        if self.batch_index is not None:
            arrays["batch_index"] = np.array([[self.batch_index]], dtype=np.int32)
        return {name: a for name, a in arrays.items() if name in self.wanted or name == "batch_index"}

    @property
    def done(self) -> bool:
        return self.finished_samples >= self.samples


def _drop_end_token(arrays: dict[str, np.ndarray], end_id: int) -> None:
    """Every beam that ended on the end token loses it: from output_ids (shorter rows padded with -1, as
    TensorRT-LLM pads), sequence_length, and the per-token outputs of the first beam."""
    ids, lengths = arrays["output_ids"], arrays["sequence_length"].reshape(-1).copy()
    beams = ids.reshape(-1, ids.shape[-1]) if ids.size else np.zeros((len(lengths), 0), dtype=np.int32)
    dropped = [bool(n) and beams[b, n - 1] == end_id for b, n in enumerate(lengths.tolist())]
    if not any(dropped):
        return
    lengths -= np.array(dropped, dtype=lengths.dtype)
    width = int(lengths.max(initial=0))
    rows = np.full((len(lengths), width), -1, dtype=np.int32)
    for b, n in enumerate(lengths.tolist()):
        rows[b, :n] = beams[b, :n]
    arrays["output_ids"] = rows[None]
    arrays["sequence_length"] = lengths.reshape(1, -1).astype(np.int32)
    if dropped[0] and len(lengths) == 1:
        for name in ("output_log_probs", "generation_logits", "top_log_probs", "top_log_prob_ids"):
            if name in arrays and arrays[name].ndim >= 3 and arrays[name].shape[2]:
                arrays[name] = arrays[name][:, :, :-1]
    if response_status.NAME in arrays:
        status = response_status.unpack(arrays[response_status.NAME])
        status["sequence_length"] = arrays["sequence_length"]
        arrays[response_status.NAME] = response_status.pack(status)
