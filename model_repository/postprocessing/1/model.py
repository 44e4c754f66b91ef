"""Token ids -> text, exact while streaming (see tritonllm.tokenizer.detokenizer); passes the llm's extras on."""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonllm.runtime.model_config import ModelParameters, load_tokenizer
from tritonllm.tokenizer.detokenizer import text_increment

# Forwarded unchanged, so every output of the ensemble comes from this last step in one response.
PASS_THROUGH = (
    "finish_reason",
    "num_input_tokens",
    "num_output_tokens",
    "batch_size",
    "queue_wait_us",
    "sequence_index",
)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = ModelParameters(args)
        self.tokenizer = load_tokenizer(params.model_dir())
        self.skip_special_tokens = params.bool("skip_special_tokens", True)

    def execute(self, requests: list) -> list:
        return [self._one(request) for request in requests]

    def _one(self, request):
        def array(name: str) -> np.ndarray:
            return pb_utils.get_input_tensor_by_name(request, name).as_numpy()

        beams = array("output_ids")[0]  # [beam, tokens]
        lengths = array("sequence_length")[0]
        preceding = array("preceding_ids")[0].tolist()
        final = bool(array("finish_reason").reshape(-1)[0])
        texts = [
            text_increment(self.tokenizer, preceding, beam[:n].tolist(), final, self.skip_special_tokens)
            for beam, n in zip(beams, lengths, strict=False)
        ]
        outputs = [pb_utils.Tensor("text_output", np.array([[t.encode() for t in texts]], dtype=np.object_))]
        for name in PASS_THROUGH:
            outputs.append(pb_utils.Tensor(name, array(name)))
        return pb_utils.InferenceResponse(output_tensors=outputs)
