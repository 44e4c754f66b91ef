"""Token ids -> text, exact while streaming (see tritonllm.tokenizer.detokenizer); passes the llm's extras on.

Also turns the llm's log-probs into what the OpenAI APIs show: each token's text and its alternatives' texts.
"""

from __future__ import annotations

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonllm.errors import RequestError
from tritonllm.runtime import response_status
from tritonllm.runtime.model_config import ModelParameters
from tritonllm.tokenizer.backend_tokenizer import load_backend_tokenizer
from tritonllm.tokenizer.detokenizer import text_increment

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


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = ModelParameters(args)
        self.tokenizer = load_backend_tokenizer(params.model_dir())  # transformers' only on a first start

    def execute(self, requests: list) -> list:
        return [self._one(request) for request in requests]

    def _one(self, request):
        # one pass over the inputs: this runs for every streamed token of every request
        inputs = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
        status = response_status.unpack(inputs[response_status.NAME])

        beams = inputs["output_ids"][0]  # [beam, tokens]
        lengths = status["sequence_length"][0].tolist()
        preceding = inputs["preceding_ids"][0].tolist()
        final = bool(status["finish_reason"].reshape(-1)[0])
        skip = bool(status["skip_special_tokens"].reshape(-1)[0])
        texts = [
            text_increment(self.tokenizer, preceding, beam[:n].tolist(), final, skip)
            for beam, n in zip(beams, lengths, strict=False)
        ]
        ids = beams[0][: lengths[0]].tolist()
        if "check_ids" in inputs and inputs["check_ids"].any():
            vocab = len(self.tokenizer)
            outside = [t for t in ids if not 0 <= t < vocab]
            if outside:
                error = RequestError("output_ids", f"output_ids holds token ids outside [0, {vocab}): {outside[:5]}")
                return pb_utils.InferenceResponse(error=pb_utils.TritonError(error.wire()))
        log_probs = inputs["output_log_probs"][0, 0][: len(ids)]
        top_ids = inputs["top_log_prob_ids"][0, 0][: len(ids)]
        outputs = [
            pb_utils.Tensor("text_output", _strings(texts)[None]),
            pb_utils.Tensor("output_ids", np.array([ids], dtype=np.int32)),
            pb_utils.Tensor("output_log_probs", log_probs[None]),
            pb_utils.Tensor("top_log_probs", inputs["top_log_probs"][0, 0][: len(ids)][None]),
        ]
        if len(log_probs) or top_ids.size:
            decode = self.tokenizer.decode
            outputs.append(pb_utils.Tensor("token_texts", _strings(decode([t]) for t in ids)[None]))
            top_texts = [[decode([int(t)]).encode() for t in row] for row in top_ids]
            outputs.append(
                pb_utils.Tensor("top_token_texts", np.array(top_texts, dtype=np.object_).reshape(top_ids.shape)[None])
            )
        else:
            outputs.append(pb_utils.Tensor("token_texts", np.zeros((1, 0), dtype=np.object_)))
            outputs.append(pb_utils.Tensor("top_token_texts", np.zeros((1, 0, 0), dtype=np.object_)))
        outputs.extend(pb_utils.Tensor(name, status[name]) for name in FROM_STATUS)
        prompt = self._prompt_log_probs(inputs["prompt_log_probs"][0])
        outputs.append(pb_utils.Tensor("prompt_log_probs_json", _strings([prompt])[None]))
        outputs.extend(pb_utils.Tensor(name, inputs[name]) for name in PASSED_ON if name in inputs)
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def _prompt_log_probs(self, rows: np.ndarray) -> str:
        """The llm's [token id, log-prob, k ids, k log-probs] rows as JSON: the prompt's text, and each token's
        text, log-probability and alternatives."""
        if not len(rows):
            return ""
        decode, k = self.tokenizer.decode, (rows.shape[1] - 2) // 2

        def entry(row: np.ndarray) -> dict:
            token, logprob = decode([int(row[0])]), float(row[1])
            if np.isnan(logprob):  # the first token: nothing predicts it
                return {"token": token, "logprob": None, "top": []}
            top = [[decode([int(t)]), float(v)] for t, v in zip(row[2 : 2 + k], row[2 + k :], strict=True)]
            return {"token": token, "logprob": logprob, "top": top}

        prompt = decode([int(row[0]) for row in rows])
        return json.dumps({"text": prompt, "tokens": [entry(row) for row in rows]}, ensure_ascii=False)
