"""Triton adapter for tritonllm.multimodal.encoder: the queued requests' encoder inputs in (each [1, ...], as the
dynamic batcher hands them over), each one's media rows and M-RoPE positions out, the towers run over them at once
where they stack."""

from __future__ import annotations

import logging

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonllm.backend import stub_exit
from tritonllm.backend.model_parameters import ModelParameters
from tritonllm.common import errors
from tritonllm.multimodal.encoder import Encoded, MediaEncoder
from tritonllm.multimodal.families import ENCODER_INPUTS

log = logging.getLogger("tritonllm.multimodal_encoders")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.encoder = MediaEncoder(ModelParameters(args).model_dir())

    def execute(self, requests: list) -> list:
        inputs = [self._inputs(request) for request in requests]
        try:
            encoded = self.encoder.embed_all(inputs)
        except Exception as e:  # the inputs come from preprocessing: any failure here is a bug, logged
            ids = ", ".join(request.request_id() for request in requests)
            message = errors.to_message(e, ids, log)
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError(message)) for _ in requests]
        return [self._response(one) for one in encoded]

    def finalize(self) -> None:
        stub_exit.release(self)

    @staticmethod
    def _inputs(request) -> dict[str, np.ndarray]:
        found = {}
        for name in ENCODER_INPUTS:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                found[name] = tensor.as_numpy()[0]  # the batch dimension of one request
        return found

    @staticmethod
    def _response(encoded: Encoded):
        rows = encoded.rows.numpy()
        positions = encoded.rope_positions
        positions = np.zeros((3, 0), dtype=np.int32) if positions is None else positions.numpy().astype(np.int32)
        return pb_utils.InferenceResponse(
            [
                pb_utils.Tensor("OUT_PROMPT_EMBEDDING_TABLE", rows[None]),
                pb_utils.Tensor("OUT_PROMPT_VOCAB_SIZE", np.array([[rows.shape[0]]], dtype=np.int32)),
                pb_utils.Tensor("OUT_MROPE_POSITIONS", positions[None]),
                pb_utils.Tensor("OUT_MROPE_POSITION_DELTAS", np.array([[encoded.rope_delta]], dtype=np.int32)),
            ]
        )
