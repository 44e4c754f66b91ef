"""Triton adapter for backend/reranker.py: rows of (query, document) in, one score and one token count per row out.

A request with a pair over the model's token limit gets an error naming its row; the other requests of the batch
are answered.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonllm.backend import stub_exit
from tritonllm.backend.model_parameters import ModelParameters, strings
from tritonllm.backend.reranker import RERANK_MODEL_DIR_ENV, CrossEncoderScorer
from tritonllm.common import errors

log = logging.getLogger("tritonllm.reranker")


def _texts(request, name: str) -> list[str]:
    return strings(pb_utils.get_input_tensor_by_name(request, name).as_numpy(), name)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = ModelParameters(args)
        configured = os.environ.get(RERANK_MODEL_DIR_ENV) or params.get("model_dir", "")
        if not configured:
            raise ValueError(f"the reranker needs a cross-encoder folder: {RERANK_MODEL_DIR_ENV} or model_dir")
        self.scorer = CrossEncoderScorer(params.path(configured))

    def execute(self, requests: list) -> list:
        prepared: list[tuple[list[str], list[str], list[int]] | pb_utils.TritonError] = []
        for request in requests:
            try:
                queries, documents = _texts(request, "query"), _texts(request, "document")
                prepared.append((queries, documents, self.scorer.count_tokens(queries, documents)))
            except Exception as e:  # a RequestError is the request's fault; anything else a bug, logged
                prepared.append(pb_utils.TritonError(errors.to_message(e, request.request_id(), log)))
        ok = [p for p in prepared if not isinstance(p, pb_utils.TritonError)]
        scores = self.scorer.score([q for p in ok for q in p[0]], [d for p in ok for d in p[1]])
        responses, start = [], 0
        for p in prepared:
            if isinstance(p, pb_utils.TritonError):
                responses.append(pb_utils.InferenceResponse(error=p))
                continue
            rows = len(p[0])
            outputs = [
                pb_utils.Tensor("score", scores[start : start + rows, None].astype(np.float32)),
                pb_utils.Tensor("num_input_tokens", np.array(p[2], dtype=np.int32)[:, None]),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
            start += rows
        return responses

    def finalize(self) -> None:
        stub_exit.release(self)
