"""Token ids -> text: the llm's responses as the ensemble's outputs (tritonllm.tokenizer.postprocess)."""

from __future__ import annotations

from functools import partial

import triton_python_backend_utils as pb_utils

from tritonllm.backend import stub_exit, tensorrt_llm_face
from tritonllm.backend.model_parameters import ModelParameters
from tritonllm.common.errors import RequestError
from tritonllm.common.memory import release_free_memory
from tritonllm.tokenizer.backend_tokenizer import load_backend_tokenizer
from tritonllm.tokenizer.postprocess import postprocess


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = ModelParameters(args)
        self.tokenizer = load_backend_tokenizer(params.model_dir())
        release_free_memory()  # the tokenizer's load

    def execute(self, requests: list) -> list:
        return [self._one(request) for request in requests]

    def finalize(self) -> None:
        stub_exit.release(self)

    def _one(self, request):
        # one pass over the inputs: this runs for every streamed token of every request
        inputs = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
        if "TOKENS_BATCH" in inputs:  # tensorrtllm_backend's postprocessing, called on its own
            return self._tensorrt_llm(inputs)
        try:
            outputs = postprocess(self.tokenizer, inputs)
        except RequestError as error:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(error.wire()))
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in outputs.items()])

    def _tensorrt_llm(self, inputs: dict):
        if "SEQUENCE_LENGTH" not in inputs:
            error = RequestError("SEQUENCE_LENGTH", "SEQUENCE_LENGTH is required with TOKENS_BATCH")
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(error.wire()))
        decode = partial(self.tokenizer.decode, skip_special_tokens=True)
        text = tensorrt_llm_face.postprocessing_output(decode, inputs["TOKENS_BATCH"], inputs["SEQUENCE_LENGTH"])
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", text)])
