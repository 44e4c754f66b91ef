"""Triton adapter for tritonllm.backend.embedding: rows of text (or of token ids, with their lengths) in, one
vector and one token count per row out.

A request with a text over the model's token limit gets an error naming the row; the other requests of the
batch are answered.

The model itself (torch, transformers, the weights: some 350 MB and 5 CPU seconds of a server's start) is
loaded by the first request, not at load, unless the parameter `load_on_first_request` is "false": a server that
serves no embeddings pays for none. The load still checks the folder's pipeline, so a model this embedder cannot
compute fails the load, naming why.
"""

from __future__ import annotations

import logging

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonllm.backend import stub_exit
from tritonllm.backend.embedding import SentenceEmbedder, embedding_model_dir, pipeline_of
from tritonllm.backend.model_parameters import ModelParameters, strings
from tritonllm.common import errors

log = logging.getLogger("tritonllm.embedding")


def _texts(request, name: str) -> list[str] | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    return strings(tensor.as_numpy(), name)


def _id_rows(request) -> list[list[int]] | None:
    """input_ids [rows, width], each row cut at its input_lengths (the whole width without them)."""
    ids = pb_utils.get_input_tensor_by_name(request, "input_ids")
    if ids is None:
        return None
    array = ids.as_numpy()
    lengths = pb_utils.get_input_tensor_by_name(request, "input_lengths")
    widths = [array.shape[1]] * len(array) if lengths is None else lengths.as_numpy().reshape(-1).tolist()
    if len(widths) != len(array) or not all(0 < w <= array.shape[1] for w in widths):
        raise errors.RequestError("input_lengths", f"input_lengths must be one in [1, {array.shape[1]}] per row")
    return [row[:width].tolist() for row, width in zip(array, widths, strict=True)]


def _prepared(embedder, request) -> tuple[list, list[int]]:
    """The rows a request asks to embed, as the embedder reads them, and their token counts."""
    texts, rows = _texts(request, "text_input"), _id_rows(request)
    if (texts is None) == (rows is None):
        raise errors.RequestError("text_input", "give text_input or input_ids (with input_lengths)")
    if rows is None:
        return embedder.prepare(texts, _texts(request, "instruction"))
    if _texts(request, "instruction") is not None:
        raise errors.RequestError("instruction", "an instruction is text: it cannot go before token ids")
    return embedder.prepare_ids(rows)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = ModelParameters(args)
        configured = params.get("model_dir", "")
        self.model_dir = embedding_model_dir(params.path(configured) if configured else None)
        pipeline_of(self.model_dir)
        self.embedder: SentenceEmbedder | None = None
        if not params.bool("load_on_first_request", True):
            self.embedder = SentenceEmbedder(self.model_dir)

    def execute(self, requests: list) -> list:
        if self.embedder is None:
            self.embedder = SentenceEmbedder(self.model_dir)
        prepared: list[tuple[list, list[int]] | pb_utils.TritonError] = []
        for request in requests:
            try:
                prepared.append(_prepared(self.embedder, request))
            except Exception as e:  # a RequestError is the request's fault; anything else a bug, logged
                prepared.append(pb_utils.TritonError(errors.to_message(e, request.request_id(), log)))
        rows = [text for p in prepared if not isinstance(p, pb_utils.TritonError) for text in p[0]]
        vectors = self.embedder.encode(rows)
        responses, start = [], 0
        for p in prepared:
            if isinstance(p, pb_utils.TritonError):
                responses.append(pb_utils.InferenceResponse(error=p))
                continue
            texts, counts = p
            outputs = [
                pb_utils.Tensor("embedding", vectors[start : start + len(texts)]),
                pb_utils.Tensor("num_input_tokens", np.array(counts, dtype=np.int32)[:, None]),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
            start += len(texts)
        return responses

    def finalize(self) -> None:
        stub_exit.release(self)
