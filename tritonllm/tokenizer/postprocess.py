"""The llm's response tensors -> the ensemble's outputs: text exact while streaming (see detokenizer.py), the
counters unpacked from response_status, and the log-probs as the OpenAI APIs show them (each token's text and
its alternatives' texts).

The `postprocessing` model runs this for Triton clients of the ensemble; the shim runs the same function on the
llm's responses it reads directly (shim/direct_route.py), so both give the same chunks.
"""

from __future__ import annotations

import json

import numpy as np

from ..errors import RequestError
from ..runtime import response_status
from .detokenizer import text_increment

# Unpacked from the llm's response_status, so every output of the ensemble comes from this last step.
FROM_STATUS = (
    "finish_reason",
    "num_input_tokens",
    "num_output_tokens",
    "batch_size",
    "queue_wait_us",
    "sequence_index",
    "stop_token",
    "accepted_prediction_tokens",
    "rejected_prediction_tokens",
)

# Sent by the llm only when asked for, and handed on as they are.
PASSED_ON = ("cum_log_probs", "context_logits", "generation_logits")


def _strings(texts) -> np.ndarray:
    return np.array([t.encode() for t in texts], dtype=np.object_)


def postprocess(tokenizer, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One llm response (postprocessing's inputs by name, batch dimension 1) -> the ensemble's outputs by name.
    Raises RequestError when `check_ids` is set and output_ids holds ids outside the vocabulary."""
    status = response_status.unpack(inputs[response_status.NAME])
    beams = inputs["output_ids"][0]  # [beam, tokens]
    lengths = status["sequence_length"][0].tolist()
    preceding = inputs["preceding_ids"][0].tolist()
    final = bool(status["finish_reason"].reshape(-1)[0])
    skip = bool(status["skip_special_tokens"].reshape(-1)[0])
    texts = [
        text_increment(tokenizer, preceding, beam[:n].tolist(), final, skip)
        for beam, n in zip(beams, lengths, strict=False)
    ]
    ids = beams[0][: lengths[0]].tolist()
    if "check_ids" in inputs and inputs["check_ids"].any():
        vocab = len(tokenizer)
        outside = [t for t in ids if not 0 <= t < vocab]
        if outside:
            raise RequestError("output_ids", f"output_ids holds token ids outside [0, {vocab}): {outside[:5]}")
    log_probs = inputs["output_log_probs"][0, 0][: len(ids)]
    top_ids = inputs["top_log_prob_ids"][0, 0][: len(ids)]
    outputs = {
        "text_output": _strings(texts)[None],
        "output_ids": np.array([ids], dtype=np.int32),
        "output_log_probs": log_probs[None],
        "top_log_probs": inputs["top_log_probs"][0, 0][: len(ids)][None],
    }
    decode = tokenizer.decode
    # each token's own text (log-probs show it; a reasoning parser counts the tokens of the thinking by it)
    outputs["token_texts"] = _strings(decode([t]) for t in ids)[None]
    if top_ids.size:
        top_texts = [[decode([int(t)]).encode() for t in row] for row in top_ids]
        outputs["top_token_texts"] = np.array(top_texts, dtype=np.object_).reshape(top_ids.shape)[None]
        outputs["top_token_ids"] = top_ids.astype(np.int32)[None]
    else:
        outputs["top_token_texts"] = np.zeros((1, 0, 0), dtype=np.object_)
        outputs["top_token_ids"] = np.zeros((1, 0, 0), dtype=np.int32)
    outputs.update((name, status[name]) for name in FROM_STATUS)
    outputs["prompt_log_probs_json"] = _strings([_prompt_log_probs(tokenizer, inputs["prompt_log_probs"][0])])[None]
    outputs.update((name, inputs[name]) for name in PASSED_ON if name in inputs)
    return outputs


def _prompt_log_probs(tokenizer, rows: np.ndarray) -> str:
    """The llm's [token id, log-prob, k ids, k log-probs] rows as JSON: the prompt's text, and each token's text,
    id, log-probability and alternatives ([text, log-probability, id] each)."""
    if not len(rows):
        return ""
    decode, k = tokenizer.decode, (rows.shape[1] - 2) // 2

    def entry(row: np.ndarray) -> dict:
        token_id, logprob = int(row[0]), float(row[1])
        token = decode([token_id])
        if np.isnan(logprob):  # the first token: nothing predicts it
            return {"token": token, "id": token_id, "logprob": None, "top": []}
        top = [[decode([int(t)]), float(v), int(t)] for t, v in zip(row[2 : 2 + k], row[2 + k :], strict=True)]
        return {"token": token, "id": token_id, "logprob": logprob, "top": top}

    prompt = decode([int(row[0]) for row in rows])
    return json.dumps({"text": prompt, "tokens": [entry(row) for row in rows]}, ensure_ascii=False)
