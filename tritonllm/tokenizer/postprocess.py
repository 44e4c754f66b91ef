"""The llm's response tensors -> the ensemble's outputs: text exact while streaming (see detokenizer.py), the
counters unpacked from response_status, and the log-probs as the OpenAI APIs show them (each token's text and
its alternatives' texts).

The `postprocessing` model runs this for Triton clients of the ensemble; the shim runs the same function on the
llm's responses it reads directly (shim/direct_route.py), so both give the same chunks.
"""

from __future__ import annotations

import json

import numpy as np

from tritonllm.common.errors import RequestError
from tritonllm.tokenizer.detokenizer import text_increment
from tritonllm.wire import response_status

# Unpacked from the llm's response_status into every response, so every output of the ensemble comes from this
# last step.
ALWAYS_FROM_STATUS = (
    "finish_reason",
    "num_input_tokens",
    "num_output_tokens",
    "batch_size",
    "queue_wait_us",
    "sequence_index",
)
# Only where they say something: the log-prob outputs where the request asked for log-probs, stop_token in a
# sample's last response, the prediction's counts where a prediction was given, the prompt's log-probs in the first
# response that asked for them. A client that reads a missing output gets None (tritonclient's as_numpy).
CONDITIONAL = (
    "output_log_probs",
    "top_log_probs",
    "top_token_texts",
    "top_token_ids",
    "stop_token",
    "accepted_prediction_tokens",
    "rejected_prediction_tokens",
    "prompt_log_probs_json",
)
EMPTY = np.zeros((1, 1, 0), dtype=np.float32)
EMPTY_TOP = np.zeros((1, 1, 0, 0), dtype=np.float32)

# Sent by the llm only when asked for, and handed on as they are.
PASSED_ON = ("cum_log_probs", "context_logits", "generation_logits", "prompt_ids")


def _strings(texts) -> np.ndarray:
    return np.array([t.encode() for t in texts], dtype=np.object_)


def postprocess(tokenizer, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One llm response (postprocessing's inputs by name, batch dimension 1) -> the ensemble's outputs by name.
    Raises RequestError when `check_ids` is set and output_ids holds ids outside the vocabulary.

    Outputs that would carry nothing are left out (see CONDITIONAL): every tensor costs each hop of every streamed
    token, and a client reads a missing output as None."""
    missing = [name for name in ("output_ids", "preceding_ids", response_status.NAME) if name not in inputs]
    if missing:
        raise RequestError(missing[0], f"{missing[0]} is required (or TOKENS_BATCH with SEQUENCE_LENGTH)")
    status = response_status.unpack(inputs[response_status.NAME])
    beams = inputs["output_ids"][0]  # [beam, tokens]
    lengths = status["sequence_length"][0].tolist()
    preceding = inputs["preceding_ids"][0].tolist()
    reason = status["finish_reason"].reshape(-1)[0]
    final = bool(reason)
    skip = bool(status["skip_special_tokens"].reshape(-1)[0])
    # TensorRT-LLM's text leaves out the end token that ended a generation (its sequence_length does not count it),
    # whatever token end_id names; the ids and the counts keep it
    end_id = int(status["end_id"].reshape(-1)[0]) if reason == b"end_id" else None

    def said(beam: np.ndarray, n: int) -> list[int]:
        ids = beam[:n].tolist()
        return ids[:-1] if end_id is not None and ids and ids[-1] == end_id else ids

    texts = [
        text_increment(tokenizer, preceding, said(beam, n), final, skip)
        for beam, n in zip(beams, lengths, strict=False)
    ]
    ids = beams[0][: lengths[0]].tolist()
    if "check_ids" in inputs and inputs["check_ids"].any():
        vocab = len(tokenizer)
        outside = [t for t in ids if not 0 <= t < vocab]
        if outside:
            raise RequestError("output_ids", f"output_ids holds token ids outside [0, {vocab}): {outside[:5]}")
    decode = tokenizer.decode
    outputs = {
        # [beams], as tensorrtllm_backend's postprocessing answers (its clients read text_output[0])
        "text_output": _strings(texts),
        "output_ids": np.array([ids], dtype=np.int32),
        # each token's own text (a reasoning parser counts the tokens of the thinking by it)
        "token_texts": _strings(decode([t]) for t in ids)[None],
    }
    outputs.update((name, status[name]) for name in ALWAYS_FROM_STATUS)
    if final:
        outputs["stop_token"] = status["stop_token"]
    if status["accepted_prediction_tokens"].item() or status["rejected_prediction_tokens"].item():
        outputs.update((name, status[name]) for name in ("accepted_prediction_tokens", "rejected_prediction_tokens"))
    outputs.update(_log_probs(decode, inputs, len(ids)))
    if "prompt_log_probs" in inputs and inputs["prompt_log_probs"].size:
        outputs["prompt_log_probs_json"] = _strings([_prompt_log_probs(tokenizer, inputs["prompt_log_probs"][0])])[None]
    outputs.update((name, inputs[name]) for name in PASSED_ON if name in inputs)
    return outputs


def _log_probs(decode, inputs: dict[str, np.ndarray], num_tokens: int) -> dict[str, np.ndarray]:
    """The tokens' log-probs and their best alternatives with their texts, where the llm sent them (asked for by
    return_log_probs / num_top_log_probs)."""
    log_probs = inputs.get("output_log_probs", EMPTY)[0, 0][:num_tokens]
    top_ids = inputs.get("top_log_prob_ids", EMPTY_TOP)[0, 0][:num_tokens]
    if not log_probs.size and not top_ids.size:
        return {}
    top_texts = [[decode([int(t)]).encode() for t in row] for row in top_ids]
    return {
        "output_log_probs": log_probs[None, None],  # [1, beams, tokens] as TensorRT-LLM's, of the first beam
        "top_log_probs": inputs.get("top_log_probs", EMPTY_TOP)[0, 0][:num_tokens][None],
        "top_token_texts": np.array(top_texts, dtype=np.object_).reshape(top_ids.shape)[None],
        "top_token_ids": top_ids.astype(np.int32)[None],
    }


def _prompt_log_probs(tokenizer, rows: np.ndarray) -> str:
    """The llm's [token id, log-prob, rank, k ids, k log-probs] rows as JSON: the prompt's text, and each token's
    text, id, log-probability, rank and alternatives ([text, log-probability, id] each)."""
    if not len(rows):
        return ""
    decode, k = tokenizer.decode, (rows.shape[1] - 3) // 2

    def entry(row: np.ndarray) -> dict:
        token_id, logprob = int(row[0]), float(row[1])
        token = decode([token_id])
        if np.isnan(logprob):  # the first token: nothing predicts it
            return {"token": token, "id": token_id, "logprob": None, "rank": None, "top": []}
        top = [[decode([int(t)]), float(v), int(t)] for t, v in zip(row[3 : 3 + k], row[3 + k :], strict=True)]
        return {"token": token, "id": token_id, "logprob": logprob, "rank": int(row[2]), "top": top}

    prompt = decode([int(row[0]) for row in rows])
    return json.dumps({"text": prompt, "tokens": [entry(row) for row in rows]}, ensure_ascii=False)
