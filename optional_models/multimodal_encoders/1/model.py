"""Triton adapter for tritonllm.multimodal.encoder: a prompt's encoder inputs in, its media's embedding rows out."""

from __future__ import annotations

import logging

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonllm.backend.model_parameters import ModelParameters
from tritonllm.common import errors
from tritonllm.multimodal.encoder import MediaEncoder
from tritonllm.multimodal.families import ENCODER_INPUTS

log = logging.getLogger("tritonllm.multimodal_encoders")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.encoder = MediaEncoder(ModelParameters(args).model_dir())

    def execute(self, requests: list) -> list:
        return [self._one(request) for request in requests]

    def _one(self, request):
        inputs = {}
        for name in ENCODER_INPUTS:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                inputs[name] = tensor.as_numpy()
        try:
            rows = self.encoder.embed(inputs).numpy()
        except Exception as e:  # the inputs come from preprocessing: any failure here is a bug, logged
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError(errors.to_message(e, request.request_id(), log))
            )
        return pb_utils.InferenceResponse(
            [
                pb_utils.Tensor("OUT_PROMPT_EMBEDDING_TABLE", rows),
                pb_utils.Tensor("OUT_PROMPT_VOCAB_SIZE", np.array([rows.shape[0]], dtype=np.int32)),
            ]
        )
