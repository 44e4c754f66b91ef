"""Triton adapter for backend/preprocessing.py: text or chat messages -> token ids and the llm's request tensors;
a multimodal model's media go to the multimodal_encoders model (a BLS call) for their embedding rows."""

from __future__ import annotations

import logging

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonllm.backend import stub_exit
from tritonllm.backend.media_prompt import ENCODER_OUTPUTS, MediaRows
from tritonllm.backend.model_parameters import ModelParameters
from tritonllm.backend.preprocessing import TOKENIZER_OUTPUTS, Preprocessor
from tritonllm.common import errors

log = logging.getLogger("tritonllm.preprocessing")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = ModelParameters(args)
        self.encoder_model = params.get("encoder_model", "multimodal_encoders")
        self.preprocessor = Preprocessor(params, encode=self._encode)

    def _encode(self, inputs: dict[str, np.ndarray]) -> MediaRows:
        request = pb_utils.InferenceRequest(
            model_name=self.encoder_model,
            inputs=[pb_utils.Tensor(name, array[None]) for name, array in inputs.items()],  # a batch of one
            requested_output_names=list(ENCODER_OUTPUTS),
        )
        response = request.exec()
        if response.has_error():
            raise RuntimeError(f"{self.encoder_model}: {response.error().message()}")
        rows, positions, delta = (
            pb_utils.get_output_tensor_by_name(response, n).as_numpy()[0] for n in ENCODER_OUTPUTS
        )
        return MediaRows(rows, positions if positions.size else None, int(delta.reshape(-1)[0]))

    def execute(self, requests: list) -> list:
        return [self._one(request) for request in requests]

    def finalize(self) -> None:
        stub_exit.release(self)

    def _one(self, request):
        wanted = set(request.requested_output_names())
        if len(wanted) == 1 and wanted <= TOKENIZER_OUTPUTS:  # asked for alone: the inputs are not read
            (name,) = wanted
            return pb_utils.InferenceResponse([pb_utils.Tensor(name, self.preprocessor.tokenizer_output(name))])
        inputs = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
        try:
            outputs = self.preprocessor.outputs(inputs, wanted)
        except Exception as e:  # a RequestError is the request's fault; anything else a bug, logged
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError(errors.to_message(e, request.request_id(), log))
            )
        return pb_utils.InferenceResponse([pb_utils.Tensor(name, array) for name, array in outputs.items()])
